"""Grammar compilation in a child process, off the scheduler's loop, with a time limit per job.

xgrammar compiles some small constraints for a long time (a JSON schema ``pattern`` with a
large repetition count is expanded into one rule per copy: seconds each), and a compile cannot
be interrupted from Python. Run on the scheduler's thread it would freeze every other job's
decoding for as long as it takes; run in a thread it could not be stopped. So compiles run one
at a time in a child process (``python -m worker.engine.grammar_compiler``, started on first
use with its parent's death as its own, SIGKILL): the scheduler hands it canonical grammar
keys and polls for serialized compiled grammars without waiting. A compile that runs longer
than ``timeout_s`` is stopped by killing the child (the next key gets a fresh one) and fails
the jobs that wait for that key only; so is one that grows more than ``memory_limit_mib``
above the child's size at rest (worker.engine.grammar_memory); a child that dies while
compiling (a C++ crash on a hostile grammar) fails that key's jobs the same way.

Wire: ``multiprocessing.connection`` framing over two pipes, JSON payloads (no pickle).
Parent -> child: ``{"field", "text"}``; child -> parent: ``{"ready": true}`` once, then one
``{"ok": serialized}`` or ``{"error": reason}`` per request, in order.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Collection
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

from wire.lifetime import start_child
from worker.engine.grammar_memory import MemoryWatch, cap_address_space

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (field, canonical text): worker.engine.grammar.grammar_key


class Outcome(NamedTuple):
    """How a job's compile ended: the serialized grammar, or why not."""

    uid: str
    key: Key
    compiled: Any  # xgrammar.CompiledGrammar, or None
    error: str | None
    of_key: bool = True  # the error is the key's own (not the compiler's failing to start)


START_TIMEOUT_S = 120.0  # loading the tokenizer in the child
DEFAULT_MEMORY_LIMIT_MIB = 2048  # what one compile may add to the child (SchedulerConfig.grammar_memory_mib)
# NOTE: a compiled grammar's memory in the scheduler process (xgrammar's memory_size_bytes);
# reading one back costs about 1 s per 15 MB (off the scheduler's thread, but held in memory)
MAX_GRAMMAR_BYTES = 128 << 20
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_XGRAMMAR_PREFIX = re.compile(r"^\[[^\]]*\] \S+:\d+: ")  # "[06:12:14] /project/cpp/x.cc:94: "


def compile_text(compiler: Any, field: str, text: str) -> Any:
    """Compile one grammar key with an xgrammar.GrammarCompiler (raises what xgrammar raises)."""
    if field == "json_schema":
        return compiler.compile_json_schema(text, any_whitespace=False)
    if field == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
    if field == "regex":
        return compiler.compile_regex(text)
    return compiler.compile_grammar(text)


def xgrammar_reason(exc: BaseException) -> str:
    """xgrammar's message in one line, without its C++ source location."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return _XGRAMMAR_PREFIX.sub("", text)


def compile_threads() -> int:
    """xgrammar's threads for one compile: half the cores (at most 8), the rest decode."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class _Child:
    """One incarnation of the compiler process, its request pipe and a reader thread.

    NOTE: the reader thread takes the child's replies and deserializes compiled grammars (a
    large one takes seconds; xgrammar releases the GIL meanwhile), so the scheduler's thread
    only drains ``replies``. It owns the inbox and closes it at the child's EOF."""

    def __init__(self, args: list[str], memory_limit_mib: int) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH", "")]))
        env.setdefault("TQDM_DISABLE", "1")
        env.setdefault("MALLOC_ARENA_MAX", "2")  # NOTE: per-thread arenas reserve address space
        argv = [sys.executable, "-m", "worker.engine.grammar_compiler", str(to_child_r), str(from_child_w)]
        try:
            self.proc = start_child(
                argv + args,
                death_signal=signal.SIGKILL,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(to_child_r, from_child_w),
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.to_child = Connection(to_child_w, readable=False)
        self.replies: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.arrived = threading.Event()
        self.started_s = time.monotonic()
        self.ready = False
        self.info: Any = None  # xgrammar.TokenizerInfo, from the ready message
        self.memory_limit_mib = memory_limit_mib
        self.memory: MemoryWatch | None = None  # started once the child is ready (its size at rest)
        inbox = Connection(from_child_r, writable=False)
        threading.Thread(target=self._read, args=(inbox,), name="grammar-reader", daemon=True).start()

    def _read(self, inbox: Connection) -> None:
        import xgrammar as xgr

        try:
            while True:
                header = json.loads(inbox.recv_bytes())
                if "ready" in header:
                    self.info = xgr.TokenizerInfo.deserialize_json(inbox.recv_bytes().decode())
                    self.memory = MemoryWatch(self.proc.pid, self.memory_limit_mib, self._kill_now)
                    self._put("ready", self.info)
                elif "ok" in header:
                    data = inbox.recv_bytes().decode()
                    try:
                        self._put("ok", xgr.CompiledGrammar.deserialize_json(data, self.info))
                    except Exception as exc:  # NOTE: a surprise in the child's output is that key's error
                        self._put("error", f"the compiled grammar could not be read: {xgrammar_reason(exc)}")
                else:
                    self._put(
                        "error" if "error" in header else "failed", header.get("error", header.get("failed"))
                    )
        except (EOFError, OSError, ValueError):
            self._put("eof", None)
        finally:
            inbox.close()

    def _put(self, kind: str, payload: Any) -> None:
        self.replies.put((kind, payload))
        self.arrived.set()

    def _kill_now(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    def kill(self) -> None:
        if self.memory is not None:
            self.memory.stop()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.to_child.close()

    def exit_reason(self) -> str:
        if self.memory is not None and self.memory.exceeded is not None:
            self.proc.wait()
            return self.memory.reason()
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # its pipe closed but it lives on: it goes now
            self.proc.kill()
            code = self.proc.wait()
        if code < 0:
            return f"the grammar compiler was killed by signal {signal.Signals(-code).name}"
        return f"the grammar compiler exited with code {code}"


class BackgroundCompiler:
    """Compiles grammar keys in a child process, one at a time, in the order first asked for.

    ``submit(uid, key)`` queues a job's key (jobs asking for the same key share one compile);
    ``poll()`` returns an Outcome (the compiled grammar, or why not) for every job whose
    compile ended, and never blocks; ``cancel(uid)`` forgets a job. ``close()`` stops the child
    (also done when the object is collected)."""

    def __init__(
        self,
        model_path: str,
        vocab_size: int,
        stop_token_ids: Collection[int],
        timeout_s: float,
        memory_limit_mib: int = DEFAULT_MEMORY_LIMIT_MIB,
    ) -> None:
        self._args = [
            model_path,
            str(vocab_size),
            json.dumps(sorted(stop_token_ids)),
            str(compile_threads()),
            str(MAX_GRAMMAR_BYTES),
            str(memory_limit_mib),
        ]
        self.timeout_s = timeout_s
        self.memory_limit_mib = memory_limit_mib
        self._waiting: OrderedDict[Key, list[str]] = OrderedDict()  # key -> uids, first asked first
        self._running: tuple[Key, float] | None = None  # the key the child compiles, since when
        self._child: _Child | None = None
        self._alive: list[_Child] = []  # NOTE: the finalizer's reference: it must not hold self
        self._finalizer = weakref.finalize(self, _kill_all, self._alive)
        self.restarts = 0  # children stopped or lost (a time limit, a crash, a dropped compile)
        self.tokenizer_info: Any = None  # xgrammar.TokenizerInfo, from the first child that started

    @property
    def pending(self) -> bool:
        return bool(self._waiting)

    @property
    def child_pid(self) -> int | None:
        return self._child.proc.pid if self._child is not None else None

    def submit(self, uid: str, key: Key) -> None:
        self._waiting.setdefault(key, []).append(uid)

    def cancel(self, uid: str) -> None:
        """Forget a job; a compile no job waits for any more is dropped (stopped if running)."""
        for key, uids in list(self._waiting.items()):
            if uid in uids:
                uids.remove(uid)
                if not uids:
                    del self._waiting[key]
                    if self._running is not None and self._running[0] == key:
                        self._stop_child()  # NOTE: nobody polls a queue with nothing waiting

    def wait(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` for the child's next reply (when nothing else is to do)."""
        if self._child is not None:
            self._child.arrived.wait(timeout_s)
        else:
            time.sleep(min(timeout_s, 0.001))

    def poll(self) -> list[Outcome]:
        done: list[Outcome] = []
        if not self._waiting:
            return done
        if self._child is None:
            try:
                self._start()
            except OSError as exc:  # NOTE: no process to be had (fork or pipe refused): the jobs' error
                return self._fail_all(f"the grammar compiler could not start: {exc}")
        child = self._child
        assert child is not None
        child.arrived.clear()
        while self._child is child:
            try:
                kind, payload = child.replies.get_nowait()
            except queue.Empty:
                break
            if kind == "eof":
                return done + self._child_died(child)
            done += self._take(kind, payload)
        if self._child is not child:
            return done
        now = time.monotonic()
        if not child.ready and now - child.started_s > START_TIMEOUT_S:
            done += self._fail_all(f"the grammar compiler did not start within {START_TIMEOUT_S:g} s")
        elif self._running is not None and now - self._running[1] > self.timeout_s:
            key = self._running[0]
            logger.warning(
                "grammar %s did not compile within %g s: restarting the compiler", key[0], self.timeout_s
            )
            self._stop_child()
            done += self._fail_key(
                key, f"did not compile within {self.timeout_s:g} s (the grammar is too complex)"
            )
        self._send_next()
        return done

    def close(self) -> None:
        self._stop_child()
        self._finalizer.detach()

    def _start(self) -> None:
        self._child = _Child(self._args, self.memory_limit_mib)
        self._alive.append(self._child)

    def _stop_child(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._alive.remove(self._child)
            self._child = None
            self.restarts += 1
        self._running = None

    def _send_next(self) -> None:
        child = self._child
        if child is None or not child.ready or self._running is not None or not self._waiting:
            return
        key = next(iter(self._waiting))
        try:
            child.to_child.send_bytes(json.dumps({"field": key[0], "text": key[1]}).encode())
        except OSError:
            return  # the child is gone: its EOF is read at the next poll
        self._running = (key, time.monotonic())

    def _take(self, kind: str, payload: Any) -> list[Outcome]:
        assert self._child is not None
        if kind == "ready":
            self._child.ready = True
            self.tokenizer_info = self.tokenizer_info or payload
            return []
        if kind == "failed":
            return self._fail_all(str(payload))
        assert self._running is not None, "a compile reply with nothing asked"
        key = self._running[0]
        self._running = None
        uids = self._waiting.pop(key, [])
        if kind == "ok":
            return [Outcome(uid, key, payload, None) for uid in uids]
        return [Outcome(uid, key, None, str(payload)) for uid in uids]

    def _fail_key(self, key: Key, why: str) -> list[Outcome]:
        return [Outcome(uid, key, None, why) for uid in self._waiting.pop(key, [])]

    def _fail_all(self, why: str) -> list[Outcome]:
        self._stop_child()
        done = [
            Outcome(uid, key, None, why, of_key=False) for key, uids in self._waiting.items() for uid in uids
        ]
        self._waiting.clear()
        return done

    def _child_died(self, child: _Child) -> list[Outcome]:
        why = child.exit_reason()
        logger.warning("%s", why)
        if not child.ready:
            return self._fail_all(f"the grammar compiler could not start: {why}")
        running = self._running
        self._stop_child()
        if running is None:
            return []
        return self._fail_key(running[0], f"{why} while compiling it")


def _kill_all(children: list[_Child]) -> None:
    for child in children:
        child.kill()


# ---- the child's side ---------------------------------------------------------------------


def main(argv: list[str]) -> int:
    read_fd, write_fd, model_path, vocab_size, stop_ids, threads, max_bytes, memory_mib = argv
    inbox = Connection(int(read_fd), writable=False)
    outbox = Connection(int(write_fd), readable=False)
    try:
        import xgrammar as xgr

        from worker.models.tokenizer import load_tokenizer_or_none

        tokenizer = load_tokenizer_or_none(model_path)
        if tokenizer is None:
            why = "structured output needs the model's tokenizer; it has none"
            outbox.send_bytes(json.dumps({"failed": why}).encode())
            return 1
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=int(vocab_size), stop_token_ids=json.loads(stop_ids)
        )
        compiler = xgr.GrammarCompiler(info, max_threads=int(threads), cache_enabled=False)
    except Exception as exc:  # NOTE: reported to the parent, which fails the waiting jobs
        why = f"structured output is unavailable: {type(exc).__name__}: {exc}"
        outbox.send_bytes(json.dumps({"failed": why}).encode())
        return 1
    cap_address_space(int(memory_mib))
    outbox.send_bytes(b'{"ready": true}')
    outbox.send_bytes(info.serialize_json().encode())
    while True:
        try:
            request = json.loads(inbox.recv_bytes())
        except EOFError:
            return 0
        try:
            compiled = compile_text(compiler, request["field"], request["text"])
        except MemoryError:
            why = f"the grammar compiler went over its memory limit of {memory_mib} MiB (grammar_memory_mib)"
            outbox.send_bytes(json.dumps({"error": why}).encode())
            continue
        except Exception as exc:  # NOTE: xgrammar raises RuntimeError (C++) and others: the job's error
            outbox.send_bytes(json.dumps({"error": xgrammar_reason(exc)}).encode())
            continue
        size = compiled.memory_size_bytes
        if size > int(max_bytes):
            why = (
                f"compiles to {size >> 20} MiB, over the limit of {int(max_bytes) >> 20} MiB: make it smaller"
            )
            outbox.send_bytes(json.dumps({"error": why}).encode())
            continue
        outbox.send_bytes(b'{"ok": true}')
        outbox.send_bytes(compiled.serialize_json().encode())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
