"""The offline Python API: ``LLM(model).generate(prompts, sampling)`` in-process, no Redis, no ZMQ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from wire.schema import ChatMessage, Result, SamplingParams, error_result
from worker.models.aliases import DEFAULT_MODEL
from worker.models.tokenizer import NoTokenizer, detokenizer, load_tokenizer_or_none
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.io import InMemoryIO
from worker.scheduler.messages import GenerateRequest, RequestFinished
from worker.scheduler.run import build_scheduler

Prompt = str | Sequence[int] | Sequence[ChatMessage] | Sequence[dict[str, str]]


def _is_single(prompt: Any) -> bool:
    """One prompt (text, token ids or one chat) rather than a list of prompts."""
    if isinstance(prompt, str):
        return True
    if isinstance(prompt, Sequence) and prompt and not isinstance(prompt[0], (str, Sequence)):
        return isinstance(prompt[0], (int, dict, ChatMessage))
    return False


class LLM:
    """Batch generation on one engine, in this process.

    ``LLM("smollm2-135m", device="cpu", page_size=16)`` takes any engine or scheduler option
    (worker.engine.config, worker.scheduler.config) as a keyword. ``generate`` returns one
    wire.schema.Result per prompt, in order.
    """

    def __init__(self, model: str = DEFAULT_MODEL, **engine_options: Any) -> None:
        self.config = SchedulerProcessConfig.from_options(model, **engine_options).resolved()
        self.io = InMemoryIO()
        self.scheduler = build_scheduler(self.config, self.io)
        self.engine = self.scheduler.engine
        self.tokenizer: Any = load_tokenizer_or_none(str(self.engine.loaded.path))
        self.scheduler.detokenize = detokenizer(self.tokenizer)
        self._next_id = 0

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of one prompt: token ids as given, text encoded, chat rendered by the template."""
        if isinstance(prompt, str) or (prompt and not isinstance(prompt[0], int)):
            if self.tokenizer is None:
                raise ValueError(f"model {self.config.model!r} has no tokenizer: pass token ids")
            from worker.models.tokenizer import prompt_ids

            if isinstance(prompt, str):
                return prompt_ids(self.tokenizer, prompt=prompt)
            return prompt_ids(self.tokenizer, messages=list(prompt))
        return [int(t) for t in cast("Sequence[int]", prompt)]  # token ids (or none at all)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Result]:
        """Generate for every prompt; ``sampling`` is one SamplingParams for all or one per prompt."""
        from worker.frontend.results import build_result

        batch = [cast(Prompt, prompts)] if _is_single(prompts) else list(cast("Sequence[Prompt]", prompts))
        if sampling is None or isinstance(sampling, SamplingParams):
            params = [sampling or SamplingParams()] * len(batch)
        else:
            params = list(sampling)
            if len(params) != len(batch):
                raise ValueError(f"sampling: {len(params)} SamplingParams for {len(batch)} prompts")
        uids: list[str] = []
        index_of: dict[str, int] = {}  # uid -> its prompt's index (the Result's job id)
        results: dict[str, Result] = {}
        for index, (prompt, sp) in enumerate(zip(batch, params, strict=True)):
            uid = f"llm-{self._next_id}"
            self._next_id += 1
            uids.append(uid)
            index_of[uid] = index
            try:
                input_ids = self.encode(prompt)
            except ValueError as exc:
                results[uid] = error_result(str(index), "invalid_job", f"prompt {index}: {exc}")
                continue
            self.io.put(GenerateRequest(uid=uid, input_ids=input_ids, sampling=sp))
        self.scheduler.run_until_idle()
        detok = self.tokenizer or NoTokenizer()
        for message in self.io.take_all():
            if isinstance(message, RequestFinished) and message.uid in index_of:
                job_id = str(index_of[message.uid])
                results[message.uid] = build_result(job_id, message, detok, model=self.engine.loaded.name)
        return [results[uid] for uid in uids]
