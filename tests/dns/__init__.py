"""dns targets against a real dnsmasq (and the server it runs)."""
