"""radixq client side: the job contract, Redis key names, the Client API and the CLI (no torch)."""

from wire.keys import QueueKeys
from wire.schema import (
    ChatMessage,
    Choice,
    ErrorInfo,
    Job,
    JobError,
    Result,
    SamplingParams,
    Timings,
    Usage,
)

__all__ = [
    "ChatMessage",
    "Choice",
    "ErrorInfo",
    "Job",
    "JobError",
    "QueueKeys",
    "Result",
    "SamplingParams",
    "Timings",
    "Usage",
]
