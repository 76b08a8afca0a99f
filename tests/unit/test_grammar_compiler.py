"""The background grammar compiler (worker.engine.grammar_compiler) on SmolLM2's tokenizer:
a key's failure (a time limit, a crash of the child, an invalid grammar) belongs to the jobs
waiting for that key only; keys behind it compile; no child outlives ``close``.

Oracles: the process table (``os.kill(pid, 0)``), a grammar compiled here by xgrammar on this
thread, byte for byte against what comes back from the child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.model_fixtures import load_grammars, smollm2_dir  # noqa: F401  (fixture)
from tests.waiting import LIVENESS_S, drive_until, wait_until
from wire.schema import SamplingParams
from worker.engine.grammar import GrammarError, Grammars, grammar_key
from worker.engine.grammar_compiler import BackgroundCompiler, Outcome

# NOTE: xgrammar expands each `pattern` repetition into rules: about 2.5 s a pattern on the
# test box, so eight take tens of seconds (one pattern of (a|b){60000} takes only 2.6 s)
SLOW = grammar_key(
    SamplingParams(
        json_schema={
            "type": "object",
            "properties": {f"p{i}": {"type": "string", "pattern": "(a|b){5000}"} for i in range(8)},
        }
    )
)
assert SLOW is not None


def _until(compiler: BackgroundCompiler, count: int, timeout_s: float = LIVENESS_S) -> list[Outcome]:
    done: list[Outcome] = []

    def take() -> None:
        done.extend(compiler.poll())
        compiler.wait(0.02)

    drive_until(
        lambda: len(done) >= count, take, lambda: f"{count} outcomes (only {done})", timeout_s=timeout_s
    )
    return done


def _nothing_yet(compiler: BackgroundCompiler) -> None:
    assert compiler.poll() == []
    compiler.wait(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0): read its state
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def compiler(smollm2_dir: Path) -> Iterator[BackgroundCompiler]:  # noqa: F811
    compiler = BackgroundCompiler(str(smollm2_dir), 49152, [2], timeout_s=60.0)
    yield compiler
    compiler.close()


@pytest.mark.model
def test_grammars_from_the_child_equal_grammars_compiled_here(smollm2_dir: Path) -> None:  # noqa: F811
    """submit/poll answer every job, jobs sharing a key once compiled, an invalid grammar
    with its field; the grammar equals the one compiled on this thread."""
    background = Grammars.in_background(str(smollm2_dir), 49152, [2], timeout_s=60.0)
    here = load_grammars(str(smollm2_dir), 49152, [2])
    assert here is not None
    schema = SamplingParams(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}})
    invalid = SamplingParams(regex="a((")
    try:
        assert background.submit("a", schema) is None
        assert background.submit("b", schema) is None
        assert background.submit("c", invalid) is None
        assert background.background is not None
        done: dict[str, object] = {}
        waiter = background.background

        def take() -> None:
            done.update(background.poll())
            waiter.wait(0.02)

        drive_until(lambda: len(done) >= 3, take, "three outcomes")
        assert done["a"] is done["b"]
        assert json.loads(done["a"].serialize_json()) == json.loads(here.compile(schema).serialize_json())  # type: ignore[attr-defined]
        error = done["c"]
        assert isinstance(error, GrammarError) and error.field == "regex" and "parenthesis" in str(error)
        assert background.submit("d", schema) is done["a"]  # cached now
    finally:
        background.close()


@pytest.mark.model
def test_time_limit_fails_that_key_only_and_the_child_restarts(compiler: BackgroundCompiler) -> None:
    compiler.timeout_s = 2.0
    compiler.submit("slow", SLOW)
    compiler.submit("quick", ("regex", "[0-9]+"))
    started = time.monotonic()
    done = {uid: (compiled, error) for uid, _, compiled, error, _ in _until(compiler, 2)}
    assert done["slow"][0] is None and "did not compile within 2 s" in str(done["slow"][1])
    assert done["quick"][1] is None and done["quick"][0] is not None
    assert compiler.restarts == 1
    print(f"slow failed and quick compiled within {time.monotonic() - started:.1f} s")


@pytest.mark.model
def test_a_crashing_child_fails_the_key_it_was_compiling_only(compiler: BackgroundCompiler) -> None:
    """A child that dies while compiling (SIGKILL sent here, as the kernel's OOM killer does;
    a SIGSEGV sent from outside can leave Python's fault handler hung, which the time limit
    then ends) answers the key it was compiling with that reason; the next key compiles in a new child."""
    compiler.submit("victim", SLOW)
    compiler.submit("next", ("regex", "[a-z]+"))
    drive_until(
        lambda: compiler._running is not None,
        lambda: _nothing_yet(compiler),
        "the child to compile the slow key",
    )
    pid = compiler.child_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    done = {uid: (compiled, error) for uid, _, compiled, error, _ in _until(compiler, 2)}
    assert done["victim"] == (None, "the grammar compiler was killed by signal SIGKILL while compiling it")
    assert done["next"][1] is None and done["next"][0] is not None
    assert compiler.child_pid != pid and not _alive(pid)


@pytest.mark.model
def test_cancel_and_close_leave_no_process(compiler: BackgroundCompiler) -> None:
    compiler.submit("gone", SLOW)
    compiler.submit("kept", ("regex", "x+"))
    compiler.cancel("gone")
    (uid, key, compiled, error, _), *rest = _until(compiler, 1)
    assert (uid, key, error, rest) == ("kept", ("regex", "x+"), None, [])
    pid = compiler.child_pid
    assert pid is not None and _alive(pid)
    compiler.close()
    assert not _alive(pid)


@pytest.mark.model
def test_cancelling_the_running_compile_stops_the_child(compiler: BackgroundCompiler) -> None:
    """A compile no job waits for any more burns no CPU: its child is stopped at once, and
    the next key gets a new one."""
    compiler.submit("gone", SLOW)
    drive_until(lambda: compiler._running is not None, lambda: _nothing_yet(compiler), "the child to compile")
    pid = compiler.child_pid
    assert pid is not None
    compiler.cancel("gone")
    assert not compiler.pending and compiler.child_pid is None and not _alive(pid)
    compiler.submit("next", ("regex", "[0-9]+"))
    ((uid, _, compiled, error, _),) = _until(compiler, 1)
    assert uid == "next" and compiled is not None and error is None


@pytest.mark.model
def test_the_child_dies_with_its_parent(smollm2_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """kill -9 of the process holding the compiler (a scheduler) takes the compiling child
    with it (its parent-death signal)."""
    import subprocess
    import sys

    script = f"""
import sys, time
from worker.engine.grammar_compiler import BackgroundCompiler
compiler = BackgroundCompiler({str(smollm2_dir)!r}, 49152, [2], timeout_s=600.0)
compiler.submit("slow", {SLOW!r})
while compiler._running is None:
    compiler.poll()
    compiler.wait(0.02)
print(compiler.child_pid, flush=True)
time.sleep(600)
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert _alive(child_pid)
        parent.kill()
        parent.wait()
        wait_until(lambda: not _alive(child_pid), "the compiler to die with its parent", poll_s=0.05)
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.model
def test_a_key_that_failed_fails_at_once_next_time(smollm2_dir: Path) -> None:  # noqa: F811
    """A grammar that ran past the time limit is not compiled again for the next job that
    asks for it (a dataset of rows sharing one hostile schema would otherwise cost the limit
    per batch, holding up every other grammar behind it): the next job gets the same error
    at once, and nothing goes to the child."""
    grammars = Grammars.in_background(str(smollm2_dir), 49152, [2], timeout_s=2.0)
    slow = SamplingParams(json_schema=json.loads(SLOW[1]))
    try:
        assert grammars.submit("first", slow) is None
        assert grammars.background is not None
        done: list[tuple[str, object]] = []
        waiter = grammars.background

        def take() -> None:
            done.extend(grammars.poll())
            waiter.wait(0.02)

        drive_until(lambda: bool(done), take, "the slow grammar's outcome")
        ((uid, error),) = done
        assert uid == "first" and isinstance(error, GrammarError) and "within 2 s" in str(error)
        with pytest.raises(GrammarError) as again:  # from submit itself: no poll, no child
            grammars.submit("second", slow)
        assert str(again.value) == str(error)
        assert not grammars.background.pending
    finally:
        grammars.close()


@pytest.mark.model
def test_a_large_grammar_is_read_back_off_the_callers_thread(
    smollm2_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 20,000-value enum compiles to about 57 MB, which xgrammar reads back in seconds: the
    reading happens on the compiler's reader thread, never on the thread that polls (the
    scheduler's), and the grammar arrives whole (it masks tokens). How long a poll takes
    meanwhile is ``python benchmarks/speed_checks.py grammar-readback``'s figure."""
    import xgrammar as xgr

    read_on: list[str] = []
    deserialize = xgr.CompiledGrammar.deserialize_json

    def spied(*args: object, **kwargs: object) -> object:
        read_on.append(threading.current_thread().name)
        return deserialize(*args, **kwargs)

    monkeypatch.setattr(xgr.CompiledGrammar, "deserialize_json", staticmethod(spied))
    schema = SamplingParams(json_schema={"enum": [f"value{i}" for i in range(20000)]})
    background = Grammars.in_background(str(smollm2_dir), 49152, [2], timeout_s=120.0)
    try:
        assert background.submit("big", schema) is None
        assert background.background is not None
        done: list[tuple[str, object]] = []
        waiter = background.background

        def take() -> None:
            done.extend(background.poll())
            waiter.wait(0.02)

        drive_until(lambda: bool(done), take, "the big grammar's outcome")
        ((uid, compiled),) = done
        assert uid == "big" and not isinstance(compiled, GrammarError)
        assert read_on == ["grammar-reader"] and threading.current_thread().name != "grammar-reader"
        matcher = background.matcher(compiled)
        bitmask = background.token_bitmask([matcher])
        assert bitmask is not None and 0 < int((bitmask != 0).sum())
    finally:
        background.close()


@pytest.mark.model
def test_a_grammar_over_the_memory_limit_is_that_jobs_error(
    smollm2_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker.engine import grammar_compiler

    monkeypatch.setattr(grammar_compiler, "MAX_GRAMMAR_BYTES", 1 << 20)
    compiler = BackgroundCompiler(str(smollm2_dir), 49152, [2], timeout_s=60.0)
    try:
        big = grammar_key(SamplingParams(json_schema={"enum": [f"value{i}" for i in range(20000)]}))
        assert big is not None
        compiler.submit("big", big)
        compiler.submit("small", ("regex", "[0-9]+"))
        done = {outcome.uid: outcome for outcome in _until(compiler, 2)}
        assert done["big"].compiled is None and "over the limit of 1 MiB" in str(done["big"].error)
        assert done["small"].compiled is not None and compiler.restarts == 0
    finally:
        compiler.close()


@pytest.mark.model
def test_a_compiler_that_cannot_start_fails_the_waiting_jobs(
    compiler: BackgroundCompiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No process to be had (fork refused under memory pressure): the waiting jobs get that
    error, not the scheduler an exception; the next job tries again."""
    from worker.engine import grammar_compiler

    def refused(args: list[str], memory_limit_mib: int) -> None:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(grammar_compiler, "_Child", refused)
    compiler.submit("a", ("regex", "x+"))
    ((uid, _, compiled, error, of_key),) = compiler.poll()
    assert (uid, compiled, of_key) == ("a", None, False)
    assert "could not start" in str(error) and "Cannot allocate memory" in str(error)
    monkeypatch.undo()
    compiler.submit("b", ("regex", "x+"))
    ((uid, _, compiled, error, _),) = _until(compiler, 1)
    assert uid == "b" and compiled is not None


# NOTE: issue 21's schema shape: xgrammar's memory for it grows without bound (10 GB in 15 s there)
HUGE_ANYOF = grammar_key(
    SamplingParams(
        json_schema={
            "anyOf": [
                {
                    "type": "object",
                    "properties": {f"k{i}": {"type": "string", "pattern": "[a-z]{1,8}"}},
                    "required": [f"k{i}"],
                }
                for i in range(2000)
            ]
        }
    )
)
assert HUGE_ANYOF is not None


@pytest.mark.model  # about 40 s: the compile takes a while to grow
def test_a_compile_over_the_memory_limit_fails_that_key_only(smollm2_dir: Path) -> None:  # noqa: F811
    """A 2,000-branch anyOf with a 256 MiB limit: the child is stopped once it grows past its
    size at rest plus the limit (its resident size, sampled here from /proc, never goes more
    than a few MiB past that), the key fails naming the limit and the setting, and the key
    behind it compiles in a new child."""
    from worker.engine.grammar_memory import resident_bytes

    compiler = BackgroundCompiler(str(smollm2_dir), 49152, [2], timeout_s=600.0, memory_limit_mib=256)
    try:
        compiler.submit("huge", HUGE_ANYOF)
        compiler.submit("next", ("regex", "[a-z]+"))
        done: dict[str, tuple[object, str | None]] = {}
        peak, baseline = 0, None

        def sample() -> None:  # the child's size, every 10 ms while it compiles
            nonlocal peak, baseline
            done.update((o.uid, (o.compiled, o.error)) for o in compiler.poll())
            child = compiler._child
            if child is not None and child.memory is not None and "huge" not in done:
                baseline = child.memory.baseline_bytes
                peak = max(peak, resident_bytes(child.proc.pid) or 0)
            compiler.wait(0.01)

        drive_until(lambda: len(done) >= 2, sample, "both outcomes")
        assert done["huge"][0] is None
        assert done["huge"][1] == (
            f"the grammar compiler went over its memory limit of 256 MiB above its {baseline >> 20} MiB "  # type: ignore[operator]
            "at rest (grammar_memory_mib) while compiling it"
        )
        assert baseline is not None and peak > baseline + (128 << 20)  # it did grow, and then...
        assert peak <= baseline + (256 << 20) + (64 << 20), (peak >> 20, baseline >> 20)  # ...no further
        assert done["next"][1] is None and done["next"][0] is not None
        print(f"child at rest {baseline >> 20} MiB, largest seen {peak >> 20} MiB")
    finally:
        compiler.close()


def test_the_address_space_cap_refuses_an_allocation_past_it() -> None:
    """The backstop: in a process capped at its size now plus 64 MiB (and BACKSTOP_MIB), an
    allocation of 4 GiB fails with MemoryError instead of growing the process."""
    code = (
        "from worker.engine.grammar_memory import cap_address_space\n"
        "cap_address_space(64)\n"
        "try:\n"
        "    bytearray(4 << 30)\n"
        "except MemoryError:\n"
        "    print('refused')\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "refused", out.stderr
