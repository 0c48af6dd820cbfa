"""The management HTTP API: RabbitMQ's `/api/...` paths, run in the broker's event loop."""
