"""The stream contract: jobs and results as versioned msgspec Structs, msgpack on the wire.

Every Struct validates itself in ``__post_init__``, which msgspec also runs while decoding,
so the same checks guard enqueue (construction) and intake (decoding). A failed check raises
``ValueError`` naming the field, the value and why; msgspec wraps it in
``msgspec.ValidationError`` with the field's path when it happens during decoding.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from wire.bounds import (
    JobError,
    check,
    check_int,
    check_json_value,
    check_list,
    check_number,
    check_token_ids,
    is_int,
)
from wire.nesting import Outline, msgpack_outline

SCHEMA_VERSION = 1
MAX_JOB_BYTES = 1 << 20  # a job's encoded payload, prompt included
MAX_ID_CHARS = 256
MAX_TOKENS_LIMIT = 1 << 20
MAX_N = 64
MAX_TOP_K = 1 << 20  # above any vocabulary; the engine treats top_k >= its vocabulary as off
SEED_LIMIT = 1 << 63  # seeds are in [0, SEED_LIMIT)
MAX_TEMPERATURE = 1e4
GREEDY_EPSILON = 1e-5  # temperatures below this sample greedily (as vLLM)
MIN_TOP_P = 1.2e-38  # about float32's smallest normal number: a smaller top_p reads as 0 there
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_METADATA_DEPTH = 32  # dicts and lists, the metadata object itself counting as one
MAX_TOP_LOGPROBS = 20  # as OpenAI
MAX_PENALTY = 2.0  # frequency_penalty and presence_penalty lie in [-2, 2], as OpenAI
MAX_REPETITION_PENALTY = 100.0
# NOTE: 1 / MAX: smaller values divide float32 logits by 0 or a subnormal (+inf logits, NaN draws)
MIN_REPETITION_PENALTY = 0.01
MAX_LOGIT_BIAS = 1024  # entries
MAX_BIAS = 100.0  # a logit_bias value lies in [-100, 100], as OpenAI
MAX_REGEX_CHARS = 16384
MAX_CHOICES = 1024  # strings in a `choice` constraint
MAX_PROMPTS = 256  # strings in a job's ``prompts``
STRUCTURED_FIELDS = ("json_schema", "json_object", "regex", "choice")

FinishReason = Literal["stop", "length", "error"]

_TOP_K_REASON = f"must be an integer in [1, {MAX_TOP_K}], or -1/0 for off"
_TOP_P_REASON = f"must be in (0, 1], and at least {MIN_TOP_P:g}"
_STOP_REASON = f"stop strings must be non-empty, of at most {MAX_STOP_CHARS} characters"
_ID_REASON = f"must be a non-empty string of at most {MAX_ID_CHARS} characters"
_NAME_REASON = f"must be a non-empty string of at most {MAX_ID_CHARS} characters"
_PROMPT_KINDS = ("prompt", "messages", "input_ids", "prompts")
_VERSION_REASON = f"unsupported schema version (this is {SCHEMA_VERSION})"


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to sample one job's completion(s). Defaults follow vLLM/SGLang; bounds: docs/guide.md."""

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
    min_tokens: int = 0  # EOS and stop tokens are masked until this many tokens were generated
    # logprobs of the sampled tokens (and of the top_logprobs most likely ones) in the result
    logprobs: bool = False
    top_logprobs: int = 0
    # penalties: frequency/presence over generated tokens (OpenAI, vLLM), repetition over
    # prompt and output (transformers); logit_bias maps token ids, as decimal strings, to a bias
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] = {}
    # structured output: at most one of these constrains the completion
    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None

    def __post_init__(self) -> None:
        check_int(self.max_tokens, "max_tokens", 1, MAX_TOKENS_LIMIT)
        check_number(self.temperature, "temperature", 0.0, MAX_TEMPERATURE)
        check_number(self.top_p, "top_p", MIN_TOP_P, 1.0, _TOP_P_REASON)
        if not (self.top_k in (-1, 0) and is_int(self.top_k)):
            check_int(self.top_k, "top_k", 1, MAX_TOP_K, _TOP_K_REASON)
        check_number(self.min_p, "min_p", 0.0, 1.0)
        if self.seed is not None:
            check_int(self.seed, "seed", 0, SEED_LIMIT - 1, "must be an integer in [0, 2**63)")
        check_list(self.stop, "stop", 0, MAX_STOP_STRINGS)
        for index, stop in enumerate(self.stop):
            if not (isinstance(stop, str) and 0 < len(stop) <= MAX_STOP_CHARS):
                raise JobError(f"stop[{index}]", stop, _STOP_REASON)
        check_list(self.stop_token_ids, "stop_token_ids", 0, MAX_STOP_TOKEN_IDS)
        if self.stop_token_ids:
            check_token_ids(self.stop_token_ids, "stop_token_ids")
        check(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos, "must be true or false")
        check_int(self.n, "n", 1, MAX_N)
        check_int(self.min_tokens, "min_tokens", 0, self.max_tokens, "must be an integer in [0, max_tokens]")
        self._check_logprobs_and_penalties()
        self._check_structured()

    def _check_logprobs_and_penalties(self) -> None:
        check(isinstance(self.logprobs, bool), "logprobs", self.logprobs, "must be true or false")
        check_int(self.top_logprobs, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        check(
            self.logprobs or self.top_logprobs == 0,
            "top_logprobs",
            self.top_logprobs,
            "needs logprobs set to true",
        )
        check_number(self.frequency_penalty, "frequency_penalty", -MAX_PENALTY, MAX_PENALTY)
        check_number(self.presence_penalty, "presence_penalty", -MAX_PENALTY, MAX_PENALTY)
        check_number(
            self.repetition_penalty, "repetition_penalty", MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY
        )
        check(isinstance(self.logit_bias, dict), "logit_bias", None, "must be an object")
        check(
            len(self.logit_bias) <= MAX_LOGIT_BIAS,
            "logit_bias",
            f"{len(self.logit_bias)} entries",
            f"holds at most {MAX_LOGIT_BIAS} entries",
        )
        for key, bias in self.logit_bias.items():
            field = f"logit_bias[{key!r}]"
            ok = isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < 2**31
            check(ok, field, key, "keys must be token ids written as decimal strings, in [0, 2**31)")
            check_number(bias, field, -MAX_BIAS, MAX_BIAS)

    def _check_structured(self) -> None:
        check(isinstance(self.json_object, bool), "json_object", self.json_object, "must be true or false")
        given = [name for name in STRUCTURED_FIELDS if getattr(self, name) not in (None, False)]
        check(
            len(given) <= 1,
            given[-1] if given else "json_schema",
            given,
            "at most one of " + ", ".join(STRUCTURED_FIELDS),
        )
        if self.json_schema is not None:
            check(isinstance(self.json_schema, dict), "json_schema", None, "must be an object")
            check_json_value(self.json_schema, "json_schema", MAX_METADATA_DEPTH)
        if self.regex is not None:
            ok = isinstance(self.regex, str) and 0 < len(self.regex) <= MAX_REGEX_CHARS
            check(
                ok, "regex", self.regex, f"must be a non-empty string of at most {MAX_REGEX_CHARS} characters"
            )
        if self.choice is not None:
            check_list(self.choice, "choice", 1, MAX_CHOICES)
            for index, option in enumerate(self.choice):
                ok = isinstance(option, str) and 0 < len(option) <= MAX_STOP_CHARS
                check(
                    ok,
                    f"choice[{index}]",
                    option,
                    f"must be non-empty, of at most {MAX_STOP_CHARS} characters",
                )

    @property
    def structured(self) -> str | None:
        """Which structured-output field constrains this job, if any."""
        return next((name for name in STRUCTURED_FIELDS if getattr(self, name) not in (None, False)), None)

    @property
    def greedy(self) -> bool:
        """The one greedy rule: argmax when temperature is below GREEDY_EPSILON or top_k is 1."""
        return self.temperature < GREEDY_EPSILON or self.top_k == 1

    def top_k_for(self, vocab_size: int) -> int:
        """top_k as a sampler over ``vocab_size`` tokens applies it: 0 (off) when off or when it
        keeps the whole vocabulary."""
        return self.top_k if 0 < self.top_k < vocab_size else 0


CHAT_ROLES = (
    "system",
    "user",
    "assistant",
)  # what a chat template renders (OpenAI's "developer" maps to system)


class ChatMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    role: str
    content: str
    name: str | None = None  # the speaker's name, handed to the chat template (OpenAI's ``name``)

    def __post_init__(self) -> None:
        check(self.role in CHAT_ROLES, "role", self.role, f"must be one of {', '.join(CHAT_ROLES)}")
        check(isinstance(self.content, str), "content", self.content, "must be a string")
        if self.name is not None:
            ok = isinstance(self.name, str) and 0 < len(self.name) <= MAX_ID_CHARS
            check(ok, "name", self.name, _NAME_REASON)


class Job(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One unit of work: exactly one of prompt / messages / input_ids / prompts, plus sampling.

    ``prompts`` (an OpenAI completions request with a list of prompts) runs each prompt with
    the same sampling and answers with one Result: prompt ``i``'s choice ``c`` at index
    ``i * n + c``, as OpenAI numbers them.

    ``metadata`` is any JSON object (keys strings, integers in msgpack's range, at most
    MAX_METADATA_DEPTH deep) and comes back unchanged with the result. ``model`` names the
    model the job asks for (OpenAI's ``body.model``): a worker given served model names gives
    a job naming another one an error; without them any name is run by the worker's model."""

    id: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    input_ids: list[int] | None = None
    sampling: SamplingParams = SamplingParams()
    metadata: dict[str, Any] = {}
    prefix_key: str | None = None  # jobs with equal keys share a prompt prefix (wire.routing)
    enqueued_at_ms: int = 0
    v: int = SCHEMA_VERSION
    model: str | None = None
    prompts: list[str] | None = None

    def __post_init__(self) -> None:
        check(self.v == SCHEMA_VERSION, "v", self.v, _VERSION_REASON)
        check(isinstance(self.id, str) and 0 < len(self.id) <= MAX_ID_CHARS, "id", self.id, _ID_REASON)
        given = [name for name in _PROMPT_KINDS if getattr(self, name) is not None]
        if len(given) != 1:
            raise JobError("prompt", given, "exactly one of " + ", ".join(_PROMPT_KINDS) + " is required")
        if self.prompt is not None:
            check(
                isinstance(self.prompt, str) and self.prompt != "", "prompt", self.prompt, "must be non-empty"
            )
        if self.messages is not None:
            check(len(self.messages) > 0, "messages", self.messages, "must hold at least one message")
        if self.input_ids is not None:
            check(len(self.input_ids) > 0, "input_ids", self.input_ids, "must hold at least one token id")
            check_token_ids(self.input_ids, "input_ids")
        if self.prompts is not None:
            check_list(self.prompts, "prompts", 1, MAX_PROMPTS)
            for index, prompt in enumerate(self.prompts):
                check(
                    isinstance(prompt, str) and prompt != "", f"prompts[{index}]", prompt, "must be non-empty"
                )
        check(isinstance(self.metadata, dict), "metadata", None, "must be an object")
        check_json_value(self.metadata, "metadata", MAX_METADATA_DEPTH)
        if self.prefix_key is not None:
            check(
                isinstance(self.prefix_key, str) and 0 < len(self.prefix_key) <= MAX_ID_CHARS,
                "prefix_key",
                self.prefix_key,
                f"must be a non-empty string of at most {MAX_ID_CHARS} characters",
            )
        check_int(self.enqueued_at_ms, "enqueued_at_ms", 0, SEED_LIMIT - 1)
        if self.model is not None:
            ok = isinstance(self.model, str) and 0 < len(self.model) <= MAX_ID_CHARS
            check(ok, "model", self.model, _NAME_REASON)

    @property
    def prompt_kind(self) -> Literal["prompt", "messages", "input_ids", "prompts"]:
        if self.prompt is not None:
            return "prompt"
        if self.messages is not None:
            return "messages"
        return "input_ids" if self.input_ids is not None else "prompts"


class TopLogprob(msgspec.Struct, frozen=True, kw_only=True):
    token_id: int
    token: str  # the token's text as the tokenizer decodes it alone
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True, kw_only=True):
    """One generated token's log-probability (of the distribution it was sampled from, before
    temperature and the other sampling filters, as OpenAI and vLLM report it) and the
    ``top_logprobs`` most likely tokens at that position."""

    token_id: int
    token: str
    logprob: float
    top_logprobs: list[TopLogprob] = []


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    logprobs: list[TokenLogprob] | None = None  # present when the job asked for logprobs


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    # invalid_job | model_not_served | prompt_too_long | dead_letter | aborted | cancelled | internal
    code: str
    message: str


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    enqueued_at_ms: int = 0
    started_at_ms: int = 0  # handed to the worker's generator
    finished_at_ms: int = 0
    first_token_at_ms: int = 0  # the engine had the job's first output token (0: not known)


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


# The error code of a job stopped by ``radixq cancel`` before it had a result (producer.cancel).
CANCELLED = "cancelled"


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
    """Decode and validate a job from the wire. Raises JobError naming the field and why, and
    the job when its id can be read; never anything else, whatever ``data`` holds."""
    if len(data) > MAX_JOB_BYTES:
        raise JobError("payload", f"{len(data)} bytes", f"exceeds the limit of {MAX_JOB_BYTES} bytes")
    try:
        return _job_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise validation_error(exc, _peek_id(data)) from None
    except msgspec.DecodeError as exc:
        raise JobError("payload", None, f"not a msgpack job: {exc}", _peek_id(data)) from None
    except RecursionError:
        raise nesting_error(msgpack_outline(data)) from None
    except Exception as exc:  # NOTE: the wire boundary: a surprise here is this job's error
        raise JobError("payload", None, f"unreadable: {type(exc).__name__}: {exc}", _peek_id(data)) from None


def nesting_error(outline: Outline) -> JobError:
    """The error for a payload nested too deeply to decode: names its most deeply nested
    top-level field, and the job when its id (``id`` or ``custom_id``) was readable."""
    field = max(outline, key=lambda key: outline[key][0], default="payload")
    ids = [bounded_id(outline[key][1]) for key in ("id", "custom_id") if key in outline]
    job_id = next((job_id for job_id in ids if job_id is not None), None)
    return JobError(field, None, f"nested more than {MAX_METADATA_DEPTH} levels deep", job_id)


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
    if _CONTENT_PARTS.fullmatch(path) and reason.startswith("Expected `str`"):
        reason = CONTENT_PARTS_REASON
    return JobError(path or "job", None, reason if marker else text, job_id)


_CONTENT_PARTS = re.compile(r"messages\[\d+\]\.content")
CONTENT_PARTS_REASON = (
    "must be a string: content parts (images, audio) are not supported, radixq runs the text "
    "part of models only (an image-text checkpoint such as Gemma 3 4B-27B too)"
)


class _IdOnly(msgspec.Struct):
    id: Any = None


_id_decoder = msgspec.msgpack.Decoder(_IdOnly)


def _peek_id(data: bytes) -> str | None:
    """The job id in a payload that failed to decode as a Job, if one can be read."""
    try:
        value = _id_decoder.decode(data).id
    except RecursionError:
        value = msgpack_outline(data).get("id", (0, None))[1]
    except Exception:
        return None
    return bounded_id(value)


def bounded_id(value: Any) -> str | None:
    """``value`` when it can be a job id (a string of 1 to MAX_ID_CHARS characters), else None."""
    return value if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS else None
