"""The xDS control plane: units, the ADS protocol, and stock grpcio, grpc-go and grpc-java clients."""
