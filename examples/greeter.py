"""The Greeter service of the examples (sync and asyncio flavours)."""

from __future__ import annotations

import greet_pb2
import greet_pb2_grpc


class Greeter(greet_pb2_grpc.GreeterServicer):
    """Says hello and tells which backend answered."""

    def __init__(self, name: str = "") -> None:
        self.name = name  # set to the advertised address once it is known

    def SayHello(self, request, context):
        return greet_pb2.HelloReply(message=f"hello {request.name}", server=self.name)


class AsyncGreeter(Greeter):
    async def SayHello(self, request, context):
        return greet_pb2.HelloReply(message=f"hello {request.name}", server=self.name)
