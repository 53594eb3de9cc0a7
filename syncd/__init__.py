"""syncd: hot-standby replication of append-only JSONL memory logs over MQTT."""

__version__ = "0.1.0"
