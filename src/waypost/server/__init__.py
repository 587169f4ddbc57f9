"""``waypost.serve`` / ``waypost.serve_async``: a gRPC server's lifecycle (bind, start, THEN register; drain and
deregister on SIGTERM).

``lifecycle.py`` writes the start-up and graceful-stop sequences once; ``options.py`` holds what ``serve`` and
``serve_async`` take (defaults and checks); ``flavours.py`` how each step runs on a ``grpc.server`` or a
``grpc.aio.server``, the ``on_shutdown`` hooks and the hard deadline.
"""

from .lifecycle import AsyncServeHandle, BindError, ServeHandle, serve, serve_async
from .options import ServeKeywords, ServeOptions

__all__ = ["AsyncServeHandle", "BindError", "ServeHandle", "ServeKeywords", "ServeOptions", "serve", "serve_async"]
