"""A local Event Hubs: an AMQP 1.0 server that the unmodified azure-eventhub SDK talks to."""
