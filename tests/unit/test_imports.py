"""The dependency rule: producer never imports worker or torch; worker.cli loads no torch."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import producer

REPO_ROOT = Path(__file__).resolve().parents[2]


def loaded_after(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_producer_modules_import_neither_worker_nor_torch() -> None:
    names = sorted(f"producer.{info.name}" for info in pkgutil.iter_modules(producer.__path__))
    assert {"producer.cli", "producer.client", "producer.jsonl", "wire.schema"} <= set(names)
    modules = loaded_after("\n".join(f"import {name}" for name in names))
    assert set(names) <= modules
    offending = sorted(
        m for m in modules if m == "torch" or m == "worker" or m.startswith(("torch.", "worker."))
    )
    assert offending == []


def test_worker_cli_imports_no_torch() -> None:
    modules = loaded_after("import worker.cli\nimport worker.queue.consumer\nimport worker.queue.factory")
    assert "worker.cli" in modules
    assert not any(m == "torch" or m.startswith("torch.") for m in modules)


def test_main_registers_worker_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "worker.cli", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    for command in ("enqueue", "collect", "status", "dlq", "worker", "run"):
        assert command in out.stdout


def test_producer_source_names_no_worker_module() -> None:
    """The layering, read from the source (lazy and importlib imports included): producer
    never imports worker; the console script (worker.cli) is where the two meet. (runner.py
    starts `python -m worker.cli worker` processes: a process boundary, not an import.)"""
    import ast

    for path in sorted((REPO_ROOT / "producer").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module",
                "__import__",
                "find_spec",
            ):
                names = [
                    a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
            else:
                continue
            offending = [n for n in names if n == "worker" or n.startswith("worker.")]
            assert offending == [], f"{path.name} names {offending}"
