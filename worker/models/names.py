"""How a model can be loaded, by name, torch-free (the settings ``load_format``, ``dtype`` and
``quantization`` take their choices from here; worker.models.loader and .fp8 implement them)."""

from __future__ import annotations

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DTYPES = ("auto", "float32", "float16", "bfloat16")  # "auto": bfloat16 on CUDA, float32 on CPU
# "auto": as the checkpoint is (FP8 if published in FP8, else the model dtype); "none": the model
# dtype (an FP8 checkpoint dequantized at load); "fp8": every projection in FP8.
QUANTIZATIONS = ("auto", "none", "fp8")
