"""The outbox relay: publishes the event log to Kafka in global order."""

from runyard.relay.relay import OutboxRelay, RelayStats, load_checkpoint, save_checkpoint

__all__ = ["OutboxRelay", "RelayStats", "load_checkpoint", "save_checkpoint"]
