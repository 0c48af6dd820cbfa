"""Third-party MQTT interoperability suites run against a broker (the Eclipse Paho one)."""
