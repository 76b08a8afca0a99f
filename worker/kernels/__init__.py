"""Fused GPU kernels (Triton) with torch fallbacks; see worker.kernels.ops."""
