"""Triton kernels under triton's CPU interpreter, for the tests that run them on tiny shapes.

NOTE: triton reads TRITON_INTERPRET when it is first imported and when kernels are decorated,
so both happen with it set. It is unset again at once: left set, it would send every CPU test
collected later through the (slow) interpreter. Tests set it only while they run, which is what
worker.kernels.ops checks to pick the kernels on CPU.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch


def import_interpreted(*modules: str) -> None:
    """Import triton and ``modules`` (their kernels decorated for the interpreter), then unset
    TRITON_INTERPRET. Raises ImportError where triton is not installed."""
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        importlib.import_module("triton")
        for module in modules:
            importlib.import_module(module)
    finally:
        os.environ.pop("TRITON_INTERPRET")


def interpreted_test_module(*modules: str, native_tests: str) -> None:
    """At a test module's top: skip the module on CUDA (its kernels run natively there, in
    ``native_tests``) or without triton; else import_interpreted(*modules)."""
    if torch.cuda.is_available():
        pytest.skip(f"on CUDA the kernels run natively: {native_tests}", allow_module_level=True)
    try:
        import_interpreted(*modules)
    except ImportError:
        pytest.skip("triton is not installed (the kernels run on CUDA only)", allow_module_level=True)
