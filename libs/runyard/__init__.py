"""Runyard: an event-sourced control plane for GPU training tasks."""

__version__ = "0.1.0"
