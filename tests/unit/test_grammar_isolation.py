"""A structured-output job's grammar is its own business (SmolLM2-135M on CPU, the real engine):
compiling a slow grammar never stalls other jobs' decoding, a grammar that compiles for longer
than ``grammar_timeout_s`` fails only its job (with the field and the limit named), and jobs
with grammars behind it still run.

Oracles: the other jobs' decode tokens counted while the slow grammar waits for its answer
(a scheduler blocked by the compile would decode none until it gives up; a slow schema
compiles for about 2.5 s per ``pattern`` on the 2-core test box, measured with xgrammar
directly), transformers' greedy ``generate`` for the unconstrained job's tokens. How long a
step takes meanwhile is ``python benchmarks/speed_checks.py grammar-step``'s figure."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.model_fixtures import hf_from_dir, hf_greedy, smollm2_dir  # noqa: F401  (fixture)
from tests.waiting import LIVENESS_S
from wire.schema import SamplingParams
from worker.llm import LLM
from worker.scheduler.messages import AbortRequest, GenerateRequest, RequestFinished

# NOTE: no deadline inside the loops: under a load average of 20-28 on 2 cores the first test
# took more than 300 s (every CPU step oversubscribed; a penalties build measured 45x slower).
# pytest-timeout's 1,800 s is the hang guard.
pytestmark = [pytest.mark.model, pytest.mark.timeout(1800)]
TIMEOUT_S = 5.0
# xgrammar expands each `pattern` repetition into a rule per copy: seconds per pattern
SLOW_SCHEMA = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string", "pattern": "(a|b){5000}"} for i in range(8)},
}


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> LLM:  # noqa: F811
    llm = LLM(
        str(smollm2_dir),
        device="cpu",
        attention="torch",
        page_size=16,
        max_seq_len=512,
        grammar_timeout_s=TIMEOUT_S,
    )
    llm.generate("Hello", SamplingParams(max_tokens=2))  # NOTE: the first pass is slow (warm-up)
    return llm


@pytest.fixture(autouse=True)
def _nothing_left_behind(llm: LLM) -> Iterator[None]:
    """The module shares one scheduler: what a test leaves in it (a test that failed or timed
    out mid-run) is aborted and run out, so the next test starts from an idle scheduler."""
    yield
    scheduler = llm.scheduler
    for uid in [*scheduler.groups, *scheduler.grammar_waits.waiting]:
        llm.io.put(AbortRequest(uid))
    scheduler.run_until_idle()
    llm.io.take_all()
    scheduler.check_integrity()


def _run(llm: LLM, plain: GenerateRequest, slow: GenerateRequest, after: GenerateRequest) -> Window:
    """Put ``plain``; once it decodes, ``slow`` and ``after``; step the scheduler until all
    three are answered. The answers, and what happened while ``slow`` waited for its answer."""
    answers: dict[str, RequestFinished] = {}
    llm.io.put(plain)
    last = llm.scheduler.step(None, block=False)
    window = Window(answers)
    stats = llm.scheduler.stats
    while len(answers) < 3 or last is not None:
        if stats.decode_tokens >= 2 and window.put_at_tokens is None:
            llm.io.put(slow)
            llm.io.put(after)
            window.put_at_tokens = stats.decode_tokens
        step_started = time.perf_counter()
        last = llm.scheduler.step(last, block=False)
        step_s = time.perf_counter() - step_started
        slow_waits = window.put_at_tokens is not None and "slow" not in answers
        for message in llm.io.take_all():
            if isinstance(message, RequestFinished):
                answers[message.uid] = message
        if slow_waits:
            window.longest_step_s = max(window.longest_step_s, step_s)
            if "slow" in answers:
                window.decode_tokens = stats.decode_tokens - window.put_at_tokens
    return window


class Window:
    def __init__(self, answers: dict[str, RequestFinished]) -> None:
        self.answers = answers
        self.put_at_tokens: int | None = None  # decode tokens when the slow job was put
        self.decode_tokens = 0  # decode tokens of other jobs while the slow one waited
        self.longest_step_s = 0.0  # the longest scheduler step meanwhile


def test_slow_grammar_neither_stalls_nor_blocks_others(llm: LLM, smollm2_dir: Path) -> None:  # noqa: F811
    """A job decoding greedily while another job's grammar compiles (about 20 s alone): the
    decoding job goes on (tokens are decoded while the slow job waits), its tokens equal
    transformers', the slow job fails with an invalid_job error naming json_schema and the
    limit, and a grammar job enqueued behind it still gets its valid answer."""
    prompt = llm.encode([{"role": "user", "content": "Count from one to fifty in words."}])
    plain = GenerateRequest("plain", prompt, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    slow = GenerateRequest("slow", prompt, SamplingParams(max_tokens=8, json_schema=SLOW_SCHEMA))
    after = GenerateRequest("after", prompt, SamplingParams(max_tokens=8, choice=["yes", "no"]))
    window = _run(llm, plain, slow, after)
    answers = window.answers
    print(
        f"while the slow grammar compiled: {window.decode_tokens} tokens decoded, longest step {window.longest_step_s:.2f} s"
    )
    assert window.decode_tokens >= 3
    expected = hf_greedy(hf_from_dir(smollm2_dir), prompt, 64)
    assert answers["plain"].error_code is None
    assert answers["plain"].choices[0].token_ids[: len(expected)] == expected  # HF stops at EOS
    slow_answer = answers["slow"]
    assert slow_answer.error_code == "invalid_job" and not slow_answer.choices
    assert slow_answer.error_message is not None
    assert slow_answer.error_message.startswith("json_schema: ")
    assert f"within {TIMEOUT_S:g} s" in slow_answer.error_message
    choice = answers["after"].choices[0]
    assert answers["after"].error_code is None and choice.finish_reason == "stop"
    assert llm.tokenizer.decode(choice.token_ids) in ("yes", "no")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_complete_grammar_wins_over_min_tokens(llm: LLM, temperature: float) -> None:
    """A choice whose grammar is complete before min_tokens (only EOS allowed, and min_tokens
    masks EOS): the grammar wins, the choice ends with "stop" and one of the options, shorter
    than min_tokens; a job without a grammar in the same batch still waits for min_tokens."""
    prompt = [{"role": "user", "content": "Is the sky blue?"}]
    constrained = SamplingParams(
        max_tokens=12, min_tokens=6, temperature=temperature, seed=1, choice=["yes", "no"], n=2
    )
    plain = SamplingParams(max_tokens=12, min_tokens=6, temperature=0.0)
    results = llm.generate([prompt, prompt], [constrained, plain])
    assert results[0].error is None
    for choice in results[0].choices:
        assert choice.finish_reason == "stop" and choice.text in ("yes", "no")
        assert len(choice.token_ids) < 6
    assert len(results[1].choices[0].token_ids) >= 6


def test_a_grammar_cut_by_max_tokens_still_answers(llm: LLM) -> None:
    """A schema that needs more tokens than max_tokens: every choice ends with "length",
    max_tokens tokens that its grammar accepted (an independent xgrammar matcher replays
    them), logprobs for each; the job is not an error."""
    import xgrammar as xgr

    schema = {
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": 200}},
        "required": ["story"],
    }
    sampling = SamplingParams(max_tokens=6, json_schema=schema, n=2, seed=3, logprobs=True, top_logprobs=2)
    result = llm.generate([{"role": "user", "content": "Tell a story as JSON."}], sampling)[0]
    assert result.error is None and len(result.choices) == 2
    info = xgr.TokenizerInfo.from_huggingface(llm.tokenizer, vocab_size=49152, stop_token_ids=[2])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False)
    for choice in result.choices:
        assert choice.finish_reason == "length" and len(choice.token_ids) == 6
        assert choice.logprobs is not None and len(choice.logprobs) == 6
        matcher = xgr.GrammarMatcher(compiled)
        assert all(matcher.accept_token(token) for token in choice.token_ids)
        assert choice.text.startswith('{"story": "')


def test_a_job_aborted_while_its_grammar_compiles_is_answered_once(llm: LLM) -> None:
    """An abort that arrives while the job's grammar compiles answers it "aborted" at once;
    the compile's outcome later answers nothing more, and the scheduler goes idle."""
    schema = {**SLOW_SCHEMA, "required": ["p0"]}  # NOTE: not SLOW_SCHEMA, whose failure is remembered
    slow = GenerateRequest("gone", [1, 2, 3], SamplingParams(max_tokens=4, json_schema=schema))
    llm.io.put(slow)
    llm.scheduler.step(None, block=False)
    llm.io.put(AbortRequest("gone"))
    answers: list[RequestFinished] = []
    started = time.perf_counter()
    while True:
        last = llm.scheduler.step(None, block=False)
        answers += [m for m in llm.io.take_all() if isinstance(m, RequestFinished)]
        background = llm.scheduler.grammar_waits.grammars.background  # type: ignore[union-attr]
        if last is None and llm.scheduler.idle and not background.pending:
            break
        assert time.perf_counter() - started < LIVENESS_S, "the compile was not stopped (a hang)"
    assert [(a.uid, a.error_code) for a in answers] == [("gone", "aborted")]


def test_a_failing_compiler_answers_its_jobs_and_the_loop_goes_on(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A surprise inside the grammar engine's poll is the waiting jobs' internal error; the
    scheduler keeps serving (a plain job is answered) and the next grammar job gets a new
    compiler."""
    from worker.engine.grammar import Grammars

    def broken(self: Grammars) -> list[tuple[str, object]]:
        raise RuntimeError("boom")

    prompt = llm.encode([{"role": "user", "content": "Hi"}])
    with monkeypatch.context() as patch:
        patch.setattr(Grammars, "poll", broken)
        results = llm.generate(
            [prompt, prompt],
            [SamplingParams(max_tokens=4, regex="[a-z]{3}"), SamplingParams(max_tokens=4, temperature=0.0)],
        )
    assert results[0].error is not None and results[0].error.code == "internal"
    assert "the grammar compiler failed: boom" in results[0].error.message
    assert results[1].error is None and len(results[1].choices[0].token_ids) >= 1
    again = llm.generate([prompt], SamplingParams(max_tokens=4, regex="[a-z]{3}"))[0]
    assert again.error is None and again.choices[0].finish_reason in ("stop", "length")
