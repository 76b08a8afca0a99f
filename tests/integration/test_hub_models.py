"""`--model org/name` that is not in the local Hugging Face cache is downloaded through
huggingface_hub (issue 32, defect 6), here from a local stand-in for the hub
(tests/hub_server.py, through HF_ENDPOINT, the cache in HF_HOME under tmp_path): the run's
greedy tokens are transformers' on the same weights, and the cache then serves the id with
HF_HUB_OFFLINE set. An id the cache lacks while HF_HUB_OFFLINE is set, a hub that cannot be
reached, and an id the hub does not have are one line naming the id and the cache, exit 2,
before a Redis starts or a job goes in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.local_redis import free_port
from tests.hub_server import COMMIT, HubServer
from tests.integration.procs import radixq, subprocess_env
from tests.integration.test_setup_errors import assert_stopped_first
from tests.model_fixtures import hf_from_dir, hf_greedy, tiny_hf_model

pytestmark = pytest.mark.integration

REPO = "tiny-org/tiny-llama"
MAX_TOKENS = 5
PROMPTS = [[5, 6, 7], [9, 8, 7, 6, 5, 4], [11]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hub-llama")
    tiny_hf_model("llama", spread=0.2).save_pretrained(path)
    return path


@pytest.fixture
def hub(model_dir: Path) -> Iterator[HubServer]:
    with HubServer({REPO: model_dir}) as server:
        yield server


def hub_env(home: Path, endpoint: str, offline: bool = False) -> dict[str, str]:
    env = subprocess_env(HF_HOME=str(home), HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="1" if offline else "0")
    env.pop("HF_HUB_CACHE", None)
    return env


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    rows = [
        {"id": f"p{i}", "input_ids": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
        for i, ids in enumerate(PROMPTS)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_run_downloads_an_uncached_hub_id_then_the_cache_serves_it_offline(
    hub: HubServer, model_dir: Path, source: Path, tmp_path: Path
) -> None:
    home, out = tmp_path / "hf", tmp_path / "out.jsonl"
    args = ["run", str(source), "-o", str(out), "--model", REPO, "--device", "cpu", "--timeout", "240"]
    done = radixq(*args, env=hub_env(home, hub.url), timeout_s=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"downloading {REPO} from {hub.url} into {home / 'hub'}" in done.stderr
    snapshot = home / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / COMMIT
    assert {p.name for p in snapshot.iterdir()} == {p.name for p in model_dir.iterdir()}
    assert f"GET /{REPO}/resolve/{COMMIT}/model.safetensors" in hub.requests
    hf = hf_from_dir(model_dir)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == [f"p{i}" for i in range(len(PROMPTS))]
    for row, prompt in zip(rows, PROMPTS, strict=True):
        assert row["error"] is None and row["choices"][0]["token_ids"] == hf_greedy(hf, prompt, MAX_TOKENS)

    # Offline, the cached id passes the model check: the worker goes on to Redis (none here).
    asked = len(hub.requests)
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    worker = radixq(
        "worker", "--model", REPO, "--redis-url", unreachable, "--connect-timeout-s", "0",
        env=hub_env(home, hub.url, offline=True),
    )  # fmt: skip
    assert worker.returncode == 2 and "Redis never answered" in worker.stderr, worker.stderr
    assert len(hub.requests) == asked


def test_an_uncached_hub_id_offline_is_one_line_naming_the_id_and_the_cache(
    hub: HubServer, source: Path, tmp_path: Path
) -> None:
    home = tmp_path / "hf"
    done = radixq(
        "run", str(source), "-o", str(tmp_path / "o.jsonl"), "--model", REPO, env=hub_env(home, hub.url, True)
    )
    assert_stopped_first(done, repr(REPO), str(home / "hub"), "HF_HUB_OFFLINE is set")
    assert hub.requests == []


def test_a_hub_that_cannot_be_reached_is_one_line_naming_the_id_and_the_cache(
    source: Path, tmp_path: Path
) -> None:
    home, nowhere = tmp_path / "hf", f"http://127.0.0.1:{free_port()}"
    done = radixq(
        "run", str(source), "-o", str(tmp_path / "o.jsonl"), "--model", REPO, env=hub_env(home, nowhere)
    )
    assert_stopped_first(
        done,
        repr(REPO),
        str(home / "hub"),
        f"could not be downloaded from the hub at {nowhere} (ConnectError",
    )


def test_an_id_the_hub_does_not_have_is_one_line(hub: HubServer, source: Path, tmp_path: Path) -> None:
    home, missing = tmp_path / "hf", "tiny-org/no-such-model"
    done = radixq(
        "run", str(source), "-o", str(tmp_path / "o.jsonl"), "--model", missing, env=hub_env(home, hub.url)
    )
    assert_stopped_first(done, repr(missing), str(home / "hub"), f"the hub at {hub.url} has no such model")
