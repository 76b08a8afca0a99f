"""The KV cache's kinds by name, torch-free (the settings ``cache``, ``kv_cache_dtype`` and
``kv_scales`` take their choices from here)."""

from __future__ import annotations

# name -> "module:class"; the class is built with the page size (worker.lazy's registry style).
PREFIX_CACHES: dict[str, str] = {
    "radix": "worker.kvcache.radix:RadixCache",
    "naive": "worker.kvcache.naive:NaiveCache",
}
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")  # "auto": the model's dtype (worker.kvcache.pool)
KV_SCALES = ("calibrated", "unit")  # FP8 KV scales: per layer at load (worker.engine.kv_calibration), or 1.0
