"""The chaos scenarios: real etcd (or Consul), real backend processes, clients under steady load."""
