"""How the tests wait: on a condition, through tests/waiting.py. A test that sleeps to let
something happen, or that hand-rolls a ``deadline = time.monotonic() + ...`` loop, is checked
here: ``time.sleep`` in tests/ (tests/waiting.py aside) only where a comment on the same line says it simulates time
passing (``# simulated latency: ...``: a fake job's duration, an entry idling past a limit),
and ``time.monotonic()`` arithmetic inside a ``while`` loop only in tests/waiting.py."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
WAITING = TESTS / "waiting.py"
MARK = "simulated"  # what a sleep's comment must say


def _time_names(tree: ast.AST) -> tuple[set[str], dict[str, str]]:
    """(names the time module is bound to, {a name bound to time.sleep or time.monotonic: which})."""
    modules: set[str] = set()
    functions: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "time"}
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            functions |= {a.asname or a.name: a.name for a in node.names if a.name in ("sleep", "monotonic")}
    return modules, functions


def _is_call_of(node: ast.AST, name: str, modules: set[str], functions: dict[str, str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == name:
        return isinstance(func.value, ast.Name) and func.value.id in modules
    return isinstance(func, ast.Name) and functions.get(func.id) == name


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line."""
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string
    return found


def style_violations(source: str, waiting_module: bool = False) -> list[str]:
    """What ``source`` (a test module) does against the rules above, one line each;
    ``waiting_module``: tests/waiting.py, where the polls and deadlines live."""
    if waiting_module:
        return []
    tree = ast.parse(source)
    modules, functions = _time_names(tree)
    comments = _comments(source)
    found: list[str] = []
    for node in ast.walk(tree):
        if _is_call_of(node, "sleep", modules, functions):
            assert isinstance(node, ast.Call)
            lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            if not any(MARK in comments.get(n, "") for n in lines):
                found.append(
                    f"line {node.lineno}: time.sleep without a '# {MARK} ...' comment: wait on a condition"
                )
        if isinstance(node, ast.While):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.BinOp, ast.Compare)) and any(
                    _is_call_of(part, "monotonic", modules, functions) for part in ast.walk(inner)
                ):
                    found.append(
                        f"line {node.lineno}: a deadline loop (time.monotonic() in a while): use tests/waiting.py"
                    )
                    break
    return sorted(set(found))


def test_the_checker_finds_a_sleep_and_a_deadline_loop() -> None:
    bad = (
        "import time\n"
        "def test_x():\n"
        "    time.sleep(1.0)  # let the worker start\n"
        "    deadline = time.monotonic() + 30\n"
        "    while not done():\n"
        "        assert time.monotonic() < deadline\n"
    )
    assert style_violations(bad) == [
        "line 3: time.sleep without a '# simulated ...' comment: wait on a condition",
        "line 5: a deadline loop (time.monotonic() in a while): use tests/waiting.py",
    ]
    aliased = "from time import monotonic as now, sleep\nsleep(2)\nwhile now() < 5:\n    pass\n"
    assert len(style_violations(aliased)) == 2


def test_the_checker_allows_simulated_latency_and_waiting_helpers() -> None:
    fine = (
        "import time\n"
        "from tests.waiting import wait_until\n"
        "def test_x():\n"
        "    time.sleep(0.06)  # simulated latency: the entries idle past 50 ms\n"
        "    wait_until(lambda: done(), 'done')\n"
        "    started = time.monotonic()\n"
        "    print(time.monotonic() - started)\n"
        "    script = 'import time; time.sleep(600)'\n"
        "    while pending():\n"
        "        step()\n"
    )
    assert style_violations(fine) == []
    assert (
        style_violations("import time\nwhile time.monotonic() < 5:\n    time.sleep(1)\n", waiting_module=True)
        == []
    )


def test_every_test_waits_on_conditions() -> None:
    offenders = {
        str(path.relative_to(TESTS.parent)): found
        for path in sorted(TESTS.rglob("*.py"))
        if (found := style_violations(path.read_text(), waiting_module=path == WAITING))
    }
    assert offenders == {}
