"""Versioned, key-group-sharded checkpoints of opbuffer state (built on :mod:`state`)."""
