"""The dependency rules (docs/architecture.md "Layers"), read from the source of every module.

- ``wire`` imports no other project package; ``producer`` imports only ``wire``; ``worker``
  imports only ``wire``; ``service`` (``radixq serve``, a client-side package) imports ``wire``
  and ``producer``, never ``worker``; ``radixq`` (the composition root of the CLI) may import all.
- Inside ``worker``, a strict order: a part may import only parts below it (LAYERS).
- Nothing on the producer side or in worker.cli loads torch.

Every import counts: module level, inside functions, under ``if TYPE_CHECKING:``, and names
given to ``importlib.import_module`` / ``find_spec`` / ``__import__``. The only arrows allowed
against the order are the type-only ones in TYPE_ONLY, each with its reason.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("wire", "producer", "worker", "service", "radixq")
LAZY_NAME = re.compile(r"(wire|producer|worker|service|radixq)(\.\w+)*:\w+")
# Which project packages each package may import (itself always).
MAY_IMPORT = {
    "wire": set(),
    "producer": {"wire"},
    "worker": {"wire"},
    # the batch service is a client of the queue, as the producer is: no worker, no torch
    "service": {"wire", "producer"},
    "radixq": {"wire", "producer", "worker", "service"},
}

# worker's parts, lowest first. A part imports only parts of lower rows; parts in one row do
# not import each other. A part is a subpackage or a top-level module of worker.
LAYERS: list[set[str]] = [
    {
        "kernels",
        "lazy",
        "forward",
        "distributed",
        "options",
    },  # kernels; the lazy loader; the values crossing the engine boundary; TP collectives; the settings declaration
    {"kvcache"},  # pool (FP8 too), page table, allocator, prefix caches
    {"models"},
    {"attention"},  # reads the KV pool's layout; plans from a forward.BatchLayout
    {"engine"},
    {"scheduler"},  # the step loop; the scheduler process and its channel to the front end
    {"frontend"},  # the Generator contract, the engine-backed generator, supervising the scheduler process
    {"metrics"},
    {"queue"},
    {"config"},  # the worker's TOML/env/flag settings (engine + queue)
    {"preflight"},  # the checks run before jobs go in
    {"llm", "cli"},  # the offline API; the worker command
    {"__init__"},  # `from worker import LLM`
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}

# (importer, imported module): type-only arrows against the order, and why they stay.
TYPE_ONLY = {
    ("worker.forward", "worker.attention.base"): "ForwardBatch names the backend its pass attends with",
    ("worker.forward", "worker.kvcache.pool"): "ForwardBatch names the pool its pass writes",
    ("worker.forward", "worker.engine.sampler"): "ForwardInput names the sampling tensors the engine reads",
    ("worker.forward", "worker.engine.logprobs"): "ForwardOutput names the logprobs the engine returns",
    ("worker.frontend.engine_generator", "worker.config"): "create_generator is given the whole WorkerConfig",
    ("worker.frontend.generators", "worker.config"): "a generator factory is given the whole WorkerConfig",
}


class Import:
    def __init__(self, importer: str, target: str, line: int, type_only: bool) -> None:
        self.importer, self.target, self.line, self.type_only = importer, target, line, type_only

    def __repr__(self) -> str:
        return f"{self.importer}:{self.line} -> {self.target}{' (type only)' if self.type_only else ''}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 2:
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str) -> list[Import]:
    """Every project import in ``source`` (the module ``module``), relative ones resolved."""
    tree = ast.parse(source)
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            targets = [base]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
            "find_spec",
        ):
            targets = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and LAZY_NAME.fullmatch(node.value)
        ):
            targets = [node.value.partition(":")[0]]  # a "module:callable" the lazy loader imports
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES:
                found.append(Import(module, target, node.lineno, id(node) in type_only))
    return found


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def violations(imports: list[Import]) -> list[str]:
    """The imports that break a rule, as lines to read."""
    bad = []
    for imp in imports:
        src_pkg, dst_pkg = imp.importer.split(".")[0], imp.target.split(".")[0]
        if dst_pkg != src_pkg and dst_pkg not in MAY_IMPORT[src_pkg]:
            bad.append(f"{imp}: {src_pkg} may not import {dst_pkg}")
            continue
        if src_pkg != "worker" or dst_pkg != "worker":
            continue
        src, dst = part_of(imp.importer), part_of(imp.target)
        if src == dst:
            continue
        if src not in RANK or dst not in RANK:
            bad.append(f"{imp}: {src if src not in RANK else dst} is in no layer (add it to LAYERS)")
        elif RANK[dst] >= RANK[src] and not (imp.type_only and (imp.importer, imp.target) in TYPE_ONLY):
            bad.append(f"{imp}: {src} (layer {RANK[src]}) may not import {dst} (layer {RANK[dst]})")
    return bad


def project_imports() -> list[Import]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            found += imports_of(path.read_text(), module_name(path, REPO_ROOT))
    return found


def test_every_import_follows_the_layers() -> None:
    assert violations(project_imports()) == []


def test_every_lazy_module_callable_name_resolves() -> None:
    """The "module:callable" strings (generator factories, prefix caches) name a module that
    exists and a name it defines: a move that forgets one fails here, not in a worker."""
    names = set()
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and LAZY_NAME.fullmatch(node.value)
                ):
                    names.add(node.value)
    assert "worker.frontend.engine_generator:create_engine_generator" in names
    for name in sorted(names):
        module, _, attr = name.partition(":")
        path = REPO_ROOT / Path(*module.split("."))
        source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
        defined = {
            target.id if isinstance(target, ast.Name) else getattr(target, "name", "")
            for node in ast.parse(source).body
            for target in (node.targets if isinstance(node, ast.Assign) else [node])
        }
        assert attr in defined, f"{name}: {module} defines no {attr}"


def test_the_type_only_exceptions_are_still_type_only_and_still_there() -> None:
    seen = {(imp.importer, imp.target): imp.type_only for imp in project_imports()}
    for arrow in TYPE_ONLY:
        assert seen.get(arrow) is True, f"{arrow}: gone or no longer type-only: remove it from TYPE_ONLY"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "worker.engine.config",
            "from worker.scheduler.faults import Fault\n",
            "engine (layer 4) may not import scheduler",
        ),
        (
            "worker.attention.torch_ref",
            "def f():\n    import worker.engine.engine\n",
            "attention (layer 3) may not import engine",
        ),
        (
            "worker.queue.consumer",
            "from producer.progress import RateWindow\n",
            "worker may not import producer",
        ),
        ("wire.status", "from producer.client import Client\n", "wire may not import producer"),
        (
            "producer.runner",
            "import importlib\nimportlib.import_module('worker.cli')\n",
            "producer may not import worker",
        ),
        (
            "worker.models.decoder",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from worker.attention.base import AttentionBackend\n",
            "models (layer 2) may not import attention",
        ),
        (
            "worker.kvcache.pool",
            "from ..scheduler import req\n",
            "kvcache (layer 1) may not import scheduler",
        ),
        ("service.models", "from worker.queue.consumer import Consumer\n", "service may not import worker"),
        ("producer.client", "from service.records import Records\n", "producer may not import service"),
    ],
)
def test_a_planted_bad_import_is_caught(module: str, source: str, expected: str) -> None:
    (found,) = violations(imports_of(source, module))
    assert expected in found


def loaded_after(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_producer_wire_and_service_modules_load_neither_worker_nor_torch() -> None:
    names = sorted(
        module_name(path, REPO_ROOT)
        for package in ("producer", "wire", "service")
        for path in (REPO_ROOT / package).rglob("*.py")
    )
    assert {"producer.cli", "producer.client", "producer.jsonl", "wire.schema", "wire.keys"} <= set(names)
    modules = loaded_after("\n".join(f"import {name}" for name in names))
    assert set(names) <= modules
    offending = sorted(
        m for m in modules if m == "torch" or m == "worker" or m.startswith(("torch.", "worker."))
    )
    assert offending == []


def test_the_cli_imports_no_torch() -> None:
    modules = loaded_after(
        "import radixq.cli\nimport worker.cli\nimport worker.queue.consumer\nimport worker.frontend.generators"
    )
    assert {"radixq.cli", "worker.cli"} <= modules
    assert not any(m == "torch" or m.startswith("torch.") for m in modules)


def test_the_composition_root_registers_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "radixq", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    for command in ("enqueue", "collect", "cancel", "status", "dlq", "worker", "run", "serve"):
        assert command in out.stdout
