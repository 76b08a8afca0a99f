"""Reliability scenarios (the chaos harness): run on purpose, at full size, by
benchmarks/reliability.py (the measured table in docs/reliability.md), and at small sizes by
the fault-injection tests (tests/integration/test_reliability_*.py), which import it from
here, so that the two cannot drift apart. It starts its processes with the integration tests'
own helpers (tests.integration.procs)."""
