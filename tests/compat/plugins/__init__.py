"""Shovels and federation compared with RabbitMQ 3.10.8's shovel and federation plugins."""
