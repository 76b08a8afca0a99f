"""The stream contract: jobs and results as versioned msgspec Structs, msgpack on the wire.

Every Struct validates itself in ``__post_init__``, which msgspec also runs while decoding,
so the same checks guard enqueue (construction) and intake (decoding). A failed check raises
``ValueError`` naming the field, the value and why; msgspec wraps it in
``msgspec.ValidationError`` with the field's path when it happens during decoding.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

SCHEMA_VERSION = 1
MAX_JOB_BYTES = 1 << 20  # a job's encoded payload, prompt included
MAX_ID_CHARS = 256
MAX_TOKENS_LIMIT = 1 << 20
MAX_N = 64

FinishReason = Literal["stop", "length", "error"]


class JobError(ValueError):
    """A job (or a line of an input file) that cannot be run, with the field and the reason."""

    def __init__(self, field: str, value: Any, reason: str, job_id: str | None = None) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.job_id = job_id
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        where = f"job {job_id!r}: " if job_id is not None else ""
        what = f"{field}={shown}" if value is not None else field
        super().__init__(f"{where}{what}: {reason}")


def _check(ok: bool, field: str, value: Any, reason: str) -> None:
    if not ok:
        raise JobError(field, value, reason)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to sample one job's completion(s). Defaults follow vLLM/SGLang."""

    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        _check(_is_int(self.max_tokens), "max_tokens", self.max_tokens, "must be an integer")
        _check(
            1 <= self.max_tokens <= MAX_TOKENS_LIMIT,
            "max_tokens",
            self.max_tokens,
            f"must be between 1 and {MAX_TOKENS_LIMIT}",
        )
        _check(self.temperature >= 0, "temperature", self.temperature, "must be >= 0")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        _check(self.top_k >= -1, "top_k", self.top_k, "must be >= 1, or -1/0 for off")
        _check(0 <= self.min_p <= 1, "min_p", self.min_p, "must be in [0, 1]")
        _check(
            self.seed is None or 0 <= self.seed < 2**63,
            "seed",
            self.seed,
            "must be in [0, 2**63)",
        )
        for stop in self.stop:
            _check(isinstance(stop, str) and stop != "", "stop", stop, "stop strings must be non-empty")
        for token_id in self.stop_token_ids:
            _check(token_id >= 0, "stop_token_ids", token_id, "token ids must be >= 0")
        _check(1 <= self.n <= MAX_N, "n", self.n, f"must be between 1 and {MAX_N}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class ChatMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    role: str
    content: str

    def __post_init__(self) -> None:
        _check(self.role != "", "messages.role", self.role, "must be non-empty")


class Job(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One unit of work: exactly one of prompt / messages / input_ids, plus sampling."""

    id: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    input_ids: list[int] | None = None
    sampling: SamplingParams = SamplingParams()
    metadata: dict[str, Any] = {}
    enqueued_at_ms: int = 0
    v: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _check(
            self.v == SCHEMA_VERSION, "v", self.v, f"unsupported schema version (this is {SCHEMA_VERSION})"
        )
        _check(
            isinstance(self.id, str) and 0 < len(self.id) <= MAX_ID_CHARS,
            "id",
            self.id,
            f"must be a non-empty string of at most {MAX_ID_CHARS} characters",
        )
        given = [name for name in ("prompt", "messages", "input_ids") if getattr(self, name) is not None]
        _check(
            len(given) == 1,
            "prompt",
            given,
            "exactly one of prompt, messages, input_ids is required",
        )
        if self.prompt is not None:
            _check(self.prompt != "", "prompt", self.prompt, "must be non-empty")
        if self.messages is not None:
            _check(len(self.messages) > 0, "messages", self.messages, "must hold at least one message")
        if self.input_ids is not None:
            _check(len(self.input_ids) > 0, "input_ids", self.input_ids, "must hold at least one token id")
            for token_id in self.input_ids:
                _check(token_id >= 0, "input_ids", token_id, "token ids must be >= 0")

    @property
    def prompt_kind(self) -> Literal["prompt", "messages", "input_ids"]:
        if self.prompt is not None:
            return "prompt"
        return "messages" if self.messages is not None else "input_ids"


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    code: str  # invalid_job | prompt_too_long | dead_letter | aborted | internal
    message: str


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    enqueued_at_ms: int = 0
    started_at_ms: int = 0
    finished_at_ms: int = 0


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker writes for a job: choices, or an error, never both empty."""

    id: str
    choices: list[Choice] = []
    usage: Usage = Usage()
    metadata: dict[str, Any] = {}
    error: ErrorInfo | None = None
    model: str = ""
    worker: str = ""
    timings: Timings = Timings()
    v: int = SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        return self.error is None


def error_result(job_id: str, code: str, message: str, **fields: Any) -> Result:
    """A Result that reports a failed job; ``fields`` fills metadata, model, worker, timings."""
    return Result(id=job_id, error=ErrorInfo(code=code, message=message), **fields)


_encoder = msgspec.msgpack.Encoder()
_job_decoder = msgspec.msgpack.Decoder(Job)
_result_decoder = msgspec.msgpack.Decoder(Result)


def encode(value: Job | Result) -> bytes:
    return _encoder.encode(value)


def encode_job(job: Job) -> bytes:
    """Encode a job, refusing one whose payload exceeds MAX_JOB_BYTES."""
    data = _encoder.encode(job)
    if len(data) > MAX_JOB_BYTES:
        raise JobError("payload", f"{len(data)} bytes", f"exceeds the limit of {MAX_JOB_BYTES} bytes", job.id)
    return data


def decode_job(data: bytes) -> Job:
    """Decode and validate a job from the wire; raises JobError naming the field and why."""
    if len(data) > MAX_JOB_BYTES:
        raise JobError("payload", f"{len(data)} bytes", f"exceeds the limit of {MAX_JOB_BYTES} bytes")
    try:
        return _job_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise validation_error(exc, _peek_id(data)) from None
    except msgspec.DecodeError as exc:
        raise JobError("payload", None, f"not a msgpack job: {exc}", _peek_id(data)) from None


def decode_result(data: bytes) -> Result:
    return _result_decoder.decode(data)


def validation_error(exc: msgspec.ValidationError, job_id: str | None = None) -> JobError:
    """Turn msgspec's "reason - at `$.path`" into a JobError naming the field."""
    text = str(exc)
    reason, marker, where = text.rpartition(" - at `$")
    path = where.rstrip("`").lstrip(".") if marker else ""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, JobError):
        field = f"{path}.{cause.field}" if path else cause.field
        return JobError(field, cause.value, cause.reason, job_id)
    return JobError(path or "job", None, reason if marker else text, job_id)


def _peek_id(data: bytes) -> str | None:
    try:
        raw = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return None
    if isinstance(raw, dict) and isinstance(raw.get("id"), str):
        return raw["id"]
    return None
