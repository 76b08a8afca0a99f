"""radixq client side: the job contract, Redis key names, the Client API and the CLI (no torch)."""

from producer.keys import QueueKeys
from producer.schema import (
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
