"""Eureka (Spring Cloud Netflix), a kind written against ``waypost.kinds`` (docs/eureka.md).

- ``config``, ``target``: ``eureka://`` registry URLs and dial targets -> ``EurekaConfig`` (servers, base path);
- ``api``: a small asyncio client of Eureka's REST API, on aiohttp (the ``eureka`` extra), failing over between
  the servers; ``apps``: instances and metadata in and out of Eureka's JSON, a client's copy of the registry, the
  delta and its reconcile hash code;
- ``registrar``: ``EurekaRegistrar`` (``serve(registry="eureka://...")``) and ``waypost.EurekaPublisher``;
- ``discovery``: ``EurekaDiscovery`` (``dial("eureka://HOST/APP")``: delta fetches, the hash check);
- ``overrides``: ``waypost drain`` and the console's writes as Eureka's status override; ``console``: the console's
  view of an Eureka registry;
- ``kind``: its ``RegistryKind``, each part imported on first use.
"""
