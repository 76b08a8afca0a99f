"""A source checkout that was never pip-installed still answers its version (the at-scale queue
variant crashed on PackageNotFoundError when the project ran from PYTHONPATH)."""

from __future__ import annotations

import importlib.metadata

import pytest

from producer import openai_response


def test_version_falls_back_to_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    version = openai_response.package_version()
    assert version.endswith("+source") and version.split("+")[0].count(".") == 2, version


def test_installed_version_is_the_distribution_s() -> None:
    assert openai_response.package_version() == importlib.metadata.version("radixq")
