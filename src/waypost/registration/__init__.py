"""Registration: what ``serve()`` drives, the same for every registry kind (the state machine that registers an
instance over any kind's ``Registrar`` is ``waypost.kinds.registration.KindRegistration``):

- ``contract.py``: the ``Registration`` protocol (start / stop / pause / resume / update_metadata, their ``a*`` twins,
  ``key``, ``registered``, ``state``, ``outage``) and ``RegistrationFaces``, its blocking and async faces written once;
- ``factory.py``: which registration a registry URL, object or list gets (``make_publisher``);
- ``multi.py``: several registries backing each other up (``MultiPublisher``); ``no_registry.py``: ``registry=None``;
- ``outage.py``: the clock of a registration lost for long, its gauges and its alert.
"""
