"""Grammar compilation in a child process, off the scheduler's loop, with a time limit per job.

xgrammar compiles some small constraints for a long time (a JSON schema ``pattern`` with a
large repetition count is expanded into one rule per copy: seconds each), and a compile cannot
be interrupted from Python. Run on the scheduler's thread it would freeze every other job's
decoding for as long as it takes; run in a thread it could not be stopped. So compiles run one
at a time in a child process (``python -m worker.engine.grammar_compiler``, started on first
use with its parent's death as its own, SIGKILL): the scheduler hands it canonical grammar
keys and polls for serialized compiled grammars without waiting. A compile that runs longer
than ``timeout_s`` is stopped by killing the child (the next key gets a fresh one) and fails
the jobs that wait for that key only; a child that dies while compiling (a C++ crash on a
hostile grammar) fails that key's jobs the same way.

Wire: ``multiprocessing.connection`` framing over two pipes, JSON payloads (no pickle).
Parent -> child: ``{"field", "text"}``; child -> parent: ``{"ready": true}`` once, then one
``{"ok": serialized}`` or ``{"error": reason}`` per request, in order.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import weakref
from collections import OrderedDict
from collections.abc import Collection
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

from producer.lifetime import start_child

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (field, canonical text): worker.engine.grammar.grammar_key


class Outcome(NamedTuple):
    """How a job's compile ended: the serialized grammar, or why not."""

    uid: str
    key: Key
    serialized: str | None
    error: str | None
    of_key: bool = True  # the error is the key's own (not the compiler's failing to start)


START_TIMEOUT_S = 120.0  # loading the tokenizer in the child
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
    """One incarnation of the compiler process and its two pipe ends."""

    def __init__(self, args: list[str]) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH", "")]))
        env.setdefault("TQDM_DISABLE", "1")
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
        self.outbox = Connection(to_child_w, readable=False)
        self.inbox = Connection(from_child_r, writable=False)
        self.started_s = time.monotonic()
        self.ready = False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.outbox.close()
        self.inbox.close()

    def exit_reason(self) -> str:
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
    ``poll()`` returns ``(uid, key, serialized | None, error | None)`` for every job whose
    compile ended, and never blocks; ``cancel(uid)`` forgets a job. ``close()`` stops the child
    (also done when the object is collected)."""

    def __init__(
        self, model_path: str, vocab_size: int, stop_token_ids: Collection[int], timeout_s: float
    ) -> None:
        self._args = [model_path, str(vocab_size), json.dumps(sorted(stop_token_ids)), str(compile_threads())]
        self.timeout_s = timeout_s
        self._waiting: OrderedDict[Key, list[str]] = OrderedDict()  # key -> uids, first asked first
        self._running: tuple[Key, float] | None = None  # the key the child compiles, since when
        self._child: _Child | None = None
        self._alive: list[_Child] = []  # NOTE: the finalizer's reference: it must not hold self
        self._finalizer = weakref.finalize(self, _kill_all, self._alive)
        self.restarts = 0  # children stopped or lost (a time limit, a crash, a dropped compile)
        self.tokenizer_info: str | None = None  # xgrammar.TokenizerInfo as JSON, from the first child

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
            self._child.inbox.poll(timeout_s)
        else:
            time.sleep(min(timeout_s, 0.001))

    def poll(self) -> list[Outcome]:
        done: list[Outcome] = []
        if not self._waiting:
            return done
        if self._child is None:
            self._start()
        child = self._child
        assert child is not None
        try:
            while self._child is child and child.inbox.poll(0):
                reply = json.loads(child.inbox.recv_bytes())
                done += self._take(reply)
        except (EOFError, OSError):
            done += self._child_died(child)
            return done
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
        self._child = _Child(self._args)
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
            child.outbox.send_bytes(json.dumps({"field": key[0], "text": key[1]}).encode())
        except OSError:
            return  # the child is gone: its EOF is read at the next poll
        self._running = (key, time.monotonic())

    def _take(self, reply: dict[str, Any]) -> list[Outcome]:
        assert self._child is not None
        if reply.get("ready"):
            self._child.ready = True
            self.tokenizer_info = self.tokenizer_info or reply.get("tokenizer_info")
            return []
        if "failed" in reply:
            return self._fail_all(str(reply["failed"]))
        assert self._running is not None, "a compile reply with nothing asked"
        key = self._running[0]
        self._running = None
        uids = self._waiting.pop(key, [])
        return [Outcome(uid, key, reply.get("ok"), reply.get("error")) for uid in uids]

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
    read_fd, write_fd, model_path, vocab_size, stop_ids, threads = argv
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
        outbox.send_bytes(
            json.dumps({"failed": f"structured output is unavailable: {type(exc).__name__}: {exc}"}).encode()
        )
        return 1
    ready = {"ready": True, "tokenizer_info": info.serialize_json()}
    outbox.send_bytes(json.dumps(ready).encode())
    while True:
        try:
            request = json.loads(inbox.recv_bytes())
        except EOFError:
            return 0
        try:
            reply = {"ok": compile_text(compiler, request["field"], request["text"]).serialize_json()}
        except Exception as exc:  # NOTE: xgrammar raises RuntimeError (C++) and others: the job's error
            reply = {"error": xgrammar_reason(exc)}
        outbox.send_bytes(json.dumps(reply).encode())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
