"""How tests wait: on an event (a condition polled until it holds), under one generous
deadline whose only job is to turn a hang into a failure. No test asserts how fast something
is; speeds are measured on purpose in benchmarks/ (docs/performance.md)."""

from __future__ import annotations

# NOTE: generous on purpose: a loaded 2-core box can be 10x slower than a quiet one (under
# five other helpers' load, test_grammar_isolation's first test needed more than 120 s), and a
# deadline that a slow but correct run can reach is a flake, not a check. pytest-timeout (600 s
# a test, pyproject.toml) is the last guard.
LIVENESS_S = 300.0
