"""Eureka (Spring Cloud Netflix), a kind written against ``waypost.kinds`` (docs/eureka.md): ``kind`` (its
``RegistryKind``), ``config`` (URLs), ``api`` (the REST client, failing over between servers), ``apps`` (Eureka's
JSON, the registry copy and its hash), ``registrar``, ``discovery``, ``overrides`` (drain), ``console``."""
