"""What every resolver shares: options, recovery, reconnect backoff."""
