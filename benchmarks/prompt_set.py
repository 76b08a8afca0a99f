"""A fixed set of 200 everyday chat prompts (40 subjects x 5 kinds of request) for quality
comparisons on a real model, e.g. the FP8 KV cache's greedy agreement (fp8_quality.py)."""

from __future__ import annotations

SUBJECTS = [
    "photosynthesis", "the French Revolution", "black holes", "compound interest", "the water cycle",
    "binary search", "the Roman Empire", "vaccines", "climate change", "the stock market",
    "machine learning", "volcanoes", "the human heart", "electric cars", "the printing press",
    "coffee", "the Moon landing", "recycling", "earthquakes", "sleep",
    "the Python programming language", "honeybees", "inflation", "the Great Wall of China", "solar panels",
    "chess", "the immune system", "jazz music", "the Internet", "rainforests",
    "Shakespeare", "DNA", "the Olympic Games", "bread baking", "tides",
    "public libraries", "electricity", "the Amazon river", "meditation", "bicycles",
]  # fmt: skip
KINDS = [
    "Explain {s} to a ten-year-old.",
    "Give me three surprising facts about {s}.",
    "Write a short paragraph about {s}.",
    "What are the main advantages and disadvantages of {s}?",
    "Write a haiku about {s}.",
]


def chat_prompts() -> list[list[dict[str, str]]]:
    """The 200 prompts as one-message chats, subject-major."""
    return [[{"role": "user", "content": kind.format(s=s)}] for s in SUBJECTS for kind in KINDS]
