"""How a model can be loaded, by name, torch-free (the settings ``load_format``, ``dtype`` and
``quantization`` take their choices from here; worker.models.loader and .fp8 implement them)."""

from __future__ import annotations

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DTYPES = ("auto", "float32", "float16", "bfloat16")  # "auto": bfloat16 on CUDA, float32 on CPU
QUANTIZATIONS = ("none", "fp8")
