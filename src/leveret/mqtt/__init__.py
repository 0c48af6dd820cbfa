"""MQTT 3.1, 3.1.1 and 5.0 on the broker model (docs/mqtt.md): codec, sessions, listeners."""
