"""eureka:// registries and targets against a real Spring Cloud Eureka server (and its Maven builds)."""
