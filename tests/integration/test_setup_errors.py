"""Setup errors surface before anything slow starts (issue 17, item 2; issue 21's TOML typo).

`radixq run` checks what would stop every worker at start - its TOML file, the model's
source, the metrics ports - before it starts a Redis or enqueues a job: one `error:` line,
exit 2, and no "started a private" / "enqueued" line before it. `radixq worker` checks its
model and waits for Redis (up to --connect-timeout-s) before it loads the model, and binds
its metrics port before the load too. The oracle for "before" is what the command printed
(no Redis started, no model loaded) and, for ports, a socket this test holds.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.local_redis import free_port
from tests.integration.procs import FAKE_GENERATOR, radixq, subprocess_env

pytestmark = pytest.mark.integration


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"j{i}", "prompt": "x"}) + "\n" for i in range(3)))
    return path


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        yield holder.getsockname()[1]


def assert_stopped_first(done: object, *words: str) -> str:
    """Exit 2 with one `error:` line naming ``words``, and nothing started before it."""
    assert done.returncode == 2, done.stderr  # type: ignore[attr-defined]
    lines = done.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert all(word in lines[0] for word in words), lines[0]
    return str(lines[0])


@pytest.mark.parametrize(
    "toml, words",
    [
        ("[engine]\nmax_runing_reqs = 8\n", ("[engine] has no setting 'max_runing_reqs'",)),
        ("[engine\nmodel = 'x'\n", ("is not valid TOML",)),
        ("[queue]\nmin_idle_s = -1\n", ("min_idle_s", "must be > 0")),
    ],
)
def test_run_with_a_bad_config_file_stops_before_redis(
    toml: str, words: tuple[str, ...], source: Path, tmp_path: Path
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    done = radixq("run", str(source), "-o", str(tmp_path / "out.jsonl"), "--config", str(config))
    assert_stopped_first(done, *words)
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    "model, words",
    [
        ("/nonexistent", ("no such file or folder",)),
        ("./models/missing.gguf", ("no such file or folder",)),
        ("no-such-org/no-such-model", ("not in the Hugging Face cache", "HF_HUB_OFFLINE is set")),
        # issue 32, defect 2: a bare name that is no alias was found only once the engine started
        ("no-such-model", ("not a file or folder, an alias (smollm2-135m) or a Hugging Face id (org/name)",)),
    ],
)
def test_run_with_a_missing_model_stops_before_redis(
    model: str, words: tuple[str, ...], source: Path, tmp_path: Path
) -> None:
    env = subprocess_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")  # an empty hub cache
    done = radixq("run", str(source), "-o", str(tmp_path / "out.jsonl"), "--model", model, env=env)
    assert_stopped_first(done, repr(model), *words)


def test_run_with_a_taken_metrics_port_stops_before_redis(
    source: Path, tmp_path: Path, held_port: int
) -> None:
    out = tmp_path / "out.jsonl"
    args = ["run", str(source), "-o", str(out), "--generator", FAKE_GENERATOR, "--workers", "2"]
    done = radixq(*args, "--metrics-port", str(held_port - 1))  # worker 1 would get held_port
    assert_stopped_first(done, f"--metrics-port {held_port}")
    free = free_port()
    ok = radixq(*args, "--metrics-port", str(free), "--timeout", "60")  # the check itself takes no port
    assert ok.returncode == 0, ok.stderr


def test_worker_that_never_reaches_redis_exits_2_before_loading_the_model(tmp_path: Path) -> None:
    done = radixq("worker", "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--connect-timeout-s", "1")
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("error: ")
        and "Redis never answered at start-up" in last
        and "--connect-timeout-s" in last
    )
    assert "loaded " not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "model, words", [("/nonexistent", "no such file or folder"), ("no-such-model", "an alias")]
)
def test_worker_with_a_missing_model_exits_2_before_redis(model: str, words: str) -> None:
    done = radixq("worker", "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--model", model)
    assert_stopped_first(done, repr(model), words)


def test_worker_with_a_taken_metrics_port_exits_2_before_loading_the_model(
    redis_url: str, held_port: int
) -> None:
    done = radixq("worker", "--redis-url", redis_url, "--metrics-port", str(held_port))
    line = assert_stopped_first(done, f"--metrics-port {held_port}")
    assert "in use" in line
    assert "loaded " not in done.stderr


def test_run_with_an_unknown_generator_stops_before_redis(source: Path, tmp_path: Path) -> None:
    done = radixq(
        "run", str(source), "-o", str(tmp_path / "o.jsonl"), "--generator", "tests.fake_generator:nope"
    )
    assert_stopped_first(done, "--generator", "has no callable 'nope'")


def test_run_whose_workers_cannot_load_the_model_says_so(source: Path, tmp_path: Path) -> None:
    """A model file that is there but is no model passes the path check; the workers fail to
    load it (exit 2) and run says that, not "run the same command again to resume"."""
    garbage = tmp_path / "broken.gguf"
    garbage.write_bytes(b"not a gguf file")
    done = radixq("run", str(source), "-o", str(tmp_path / "o.jsonl"), "--model", str(garbage), timeout_s=300)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "the workers could not start (their error is above)" in last and "to resume" not in last
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (
            {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"},
            ("'GptOssForCausalLM'", "supported: "),
        ),
        ({"model_type": "falcon"}, ("model_type 'falcon'", "Qwen3MoeForCausalLM")),
        (
            {
                "architectures": ["LlamaForCausalLM"],
                "quantization_config": {"quant_method": "awq", "bits": 4},
            },
            ("quant_method 'awq'", "not supported"),
        ),
        (
            {
                "architectures": ["LlamaForCausalLM"],
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "format": "int-quantized",
                    "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "int"}}},
                },
            },
            ("compressed-tensors format 'int-quantized'", "compressed-tensors FP8"),
        ),
    ],
)
def test_run_with_an_unsupported_model_stops_before_redis(
    config: dict, words: tuple[str, ...], source: Path, tmp_path: Path
) -> None:
    """An architecture or a quantization scheme radixq cannot run is named, with the
    supported list, before a Redis starts or a job goes in (worker.models.architectures)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").write_bytes(b"")
    done = radixq("run", str(source), "-o", str(tmp_path / "out.jsonl"), "--model", str(model))
    line = assert_stopped_first(done, *words)
    assert "LlamaForCausalLM" in line or "quantization_config" in line
    assert not (tmp_path / "out.jsonl").exists()
    dummy = radixq("run", str(source), "-o", str(tmp_path / "o.jsonl"), "--model", str(model / "config.json"))
    assert_stopped_first(dummy, *words)
