"""Worker options: a TOML [engine] table, command-line overrides on top, bad input named."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.frontend.options import DEFAULT_MODEL, engine_config_from

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_toml_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text('[engine]\nmodel = "m1"\npage_size = 16\nmax_running_reqs = 8\n')
    config = engine_config_from({"config": str(path), "max_running_reqs": 4})
    assert (config.model, config.page_size, config.max_running_reqs) == ("m1", 16, 4)
    assert engine_config_from({"config": str(path), "model": "m2"}).model == "m2"


def test_default_model_without_any_option() -> None:
    assert engine_config_from({}).model == DEFAULT_MODEL


def test_bundled_configs_parse() -> None:
    for path in sorted((REPO_ROOT / "configs").glob("*.toml")):
        config = engine_config_from({"config": str(path)})
        assert config.model, path


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[engine]\nbogus = 1\n", "bogus"),
        ("[engine]\npage_size = 0\n", "page_size"),
        ("[engine\n", "not valid TOML"),
    ],
)
def test_bad_config_is_named(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises((ValueError, TypeError), match=needle):
        engine_config_from({"config": str(path)})


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        engine_config_from({"config": str(tmp_path / "nope.toml")})
