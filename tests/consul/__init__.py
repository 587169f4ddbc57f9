"""consul:// registries and targets against a real Consul agent."""
