"""The ``radixq`` command: radixq.cli composes the producer and worker commands into one CLI."""
