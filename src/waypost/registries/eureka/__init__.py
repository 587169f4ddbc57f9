"""Eureka (Spring Cloud Netflix): everything waypost knows of it, in one package (docs/eureka.md).

- ``config``: ``eureka://`` registry URLs and dial targets -> ``EurekaConfig`` (the servers, the base path);
- ``api``: a small asyncio client of Eureka's REST API, on aiohttp (the ``eureka`` extra), failing over between
  the servers;
- ``apps``: instances and metadata in and out of Eureka's JSON, a client's copy of the registry, the delta and
  its reconcile hash code;
- ``publisher``: ``EurekaPublisher``, what ``serve(registry="eureka://...")`` registers with;
- ``resolver``: ``EurekaResolver``, what ``dial("eureka://HOST/APP")`` follows;
- ``console_source``: the console's view of an Eureka registry and its drain (Eureka's status override);
- ``target``: the grammar of ``eureka://`` dial targets;
- ``kind``: its ``RegistryKind``, which ``waypost.registry.kinds`` loads by name: the generic layers reach this
  package only through it, each part imported on first use.
"""
