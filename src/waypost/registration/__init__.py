"""Registration: what ``serve()`` drives, the same for every registry kind.

- ``contract.py``: the ``Registration`` protocol (start / stop / pause / resume / update_metadata, their ``a*`` twins,
  ``key``, ``registered``, ``state``, ``outage``) and ``RegistrationFaces``, its blocking and async faces written once;
- ``state_machine.py``: the life of a registration in one registry (``PublisherBase``), which the generic
  ``KindRegistration`` (``waypost.kinds.registration``) runs over any kind's ``Registrar``;
- ``factory.py``: which registration a registry URL, object or list gets (``make_publisher``);
- ``multi.py``: several registries backing each other up (``MultiPublisher``); ``no_registry.py``: ``registry=None``;
- ``outage.py``: the clock of a registration lost for long, its gauges and its alert.
"""
