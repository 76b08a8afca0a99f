"""Reliability scenarios shared by benchmarks/reliability.py (the measured table in
docs/reliability.md) and the fault-injection tests, so that the two cannot drift apart."""
