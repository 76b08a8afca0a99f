"""One worker configuration: defaults < TOML file < RADIXQ_* environment < flags, every setting
named in errors with where its value came from, and the table of docs/configuration.md true."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.integration.procs import radixq, subprocess_env
from worker.config import (
    CPU_DEFAULTS,
    SETTINGS_PAGE,
    ConfigError,
    Setting,
    load_worker_config,
    settings,
    settings_table,
    write_settings_table,
)
from worker.engine.config import EngineConfig
from worker.models.aliases import DEFAULT_MODEL

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_each_source_overrides_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text(
        '[worker]\nqueue = "from-file"\nname = "w1"\n'
        "[queue]\nmax_attempts = 5\nread_window = 4\nmin_idle_s = 30\n"
        '[engine]\nmodel = "m1"\nmax_running_reqs = 8\npage_size = 32\n'
    )
    env = {"RADIXQ_MAX_ATTEMPTS": "2", "RADIXQ_MAX_RUNNING_REQS": "16", "RADIXQ_READ_WINDOW": "6"}
    config = load_worker_config(path, env, {"queue.read_window": 9, "engine.model": "m2"})
    assert (config.worker.queue, config.queue.queue, config.queue.name) == ("from-file", "from-file", "w1")
    assert (config.queue.min_idle_s, config.queue.max_attempts, config.queue.read_window) == (30, 2, 9)
    assert (config.engine.model, config.engine.max_running_reqs, config.engine.page_size) == ("m2", 16, 32)


def test_defaults_without_any_source() -> None:
    config = load_worker_config(None, {}, {})
    assert config.engine.model == DEFAULT_MODEL and config.worker.generator == "engine"
    assert config.worker.redis_url == "redis://localhost:6379/0" and config.queue.trim_jobs is True
    assert config.queue.name  # hostname-pid


def test_environment_strings_are_converted_and_older_names_still_work() -> None:
    env = {
        "RADIXQ_TRIM_JOBS": "false",
        "REDIS_URL": "redis://h:1/2",
        "RADIXQ_BACKEND": "m:f",
        "RADIXQ_NUM_PAGES": "64",
    }
    config = load_worker_config(None, env, {})
    assert config.queue.trim_jobs is False and config.worker.redis_url == "redis://h:1/2"
    assert config.worker.generator == "m:f" and config.engine.num_pages == 64
    both = load_worker_config(None, {**env, "RADIXQ_REDIS_URL": "redis://first:1/0"}, {})
    assert both.worker.redis_url == "redis://first:1/0"  # the radixq name wins


@pytest.mark.parametrize(
    ("text", "env", "flags", "needle"),
    [
        ("[engine]\nbogus = 1\n", {}, {}, "[engine] has no setting 'bogus'"),
        ("[queues]\n", {}, {}, "unknown table [queues]"),
        ("[engine]\npage_size = 0\n", {}, {}, "setting [engine] page_size (from [engine] page_size in"),
        ("[engine\n", {}, {}, "not valid TOML"),
        (
            "",
            {"RADIXQ_MIN_IDLE_S": "0"},
            {},
            "[queue] min_idle_s (from environment variable RADIXQ_MIN_IDLE_S)",
        ),
        ("", {"RADIXQ_MAX_ATTEMPTS": "many"}, {}, "max_attempts='many'"),
        ("", {}, {"queue.read_window": -1}, "[queue] read_window (from --read-window): read_window=-1"),
    ],
)
def test_a_bad_setting_is_named_with_its_source(
    tmp_path: Path, text: str, env: dict[str, str], flags: dict[str, object], needle: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_worker_config(path, env, flags)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_worker_config(tmp_path / "nope.toml", {}, {})


def test_bundled_configs_load() -> None:
    for path in sorted((REPO_ROOT / "configs").glob("*.toml")):
        assert load_worker_config(path, {}, {}).engine.model, path


def test_every_setting_has_an_environment_name_and_the_settings_page_is_current() -> None:
    names = [name for s in settings() for name in s.env]
    assert len(names) == len(set(names))  # no two settings share a variable
    assert SETTINGS_PAGE == REPO_ROOT / "docs" / "configuration.md"
    page = SETTINGS_PAGE.read_text()
    assert settings_table() in page, (
        "docs/configuration.md's settings table is stale: python -m worker.config docs/configuration.md"
    )
    # once: a table pasted twice (its header and first row repeated) reads as a broken table
    assert page.count(settings_table().splitlines()[0]) == 1
    assert page.count(settings_table().splitlines()[2]) == 1


def test_the_generator_rewrites_a_stale_table_in_place(tmp_path: Path) -> None:
    stale = settings_table().replace("| queue to consume |", "| an old help text |")
    page = tmp_path / "configuration.md"
    page.write_text(f"# Configuration\n\n{stale}\n\n## After\n\ntext\n")
    assert write_settings_table(page) is True
    assert page.read_text() == f"# Configuration\n\n{settings_table()}\n\n## After\n\ntext\n"
    assert write_settings_table(page) is False


def test_worker_with_a_bad_setting_exits_2_with_one_line() -> None:
    done = radixq("worker", "--read-window", "-3", env=subprocess_env(RADIXQ_MAX_ATTEMPTS="2"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert (
        line
        == "error: setting [queue] read_window (from --read-window): read_window=-3: must be >= 0 (0: two per slot of the engine)"
    )


def test_a_cpu_worker_gets_cpu_limits_unless_they_were_given(tmp_path: Path) -> None:
    gpu_sized = EngineConfig(model=DEFAULT_MODEL)  # the dataclass defaults (GPU-sized)
    cpu = load_worker_config(None, {}, {"engine.device": "cpu"})
    assert cpu.engine.max_running_reqs == CPU_DEFAULTS["engine.max_running_reqs"] < gpu_sized.max_running_reqs
    assert cpu.scheduler.max_prefill_tokens == CPU_DEFAULTS["engine.max_prefill_tokens"]
    # Given anywhere (file, environment, flag), a setting is kept.
    path = tmp_path / "w.toml"
    path.write_text('[engine]\ndevice = "cpu"\nmax_running_reqs = 3\n')
    from_file = load_worker_config(path, {}, {})
    assert (from_file.engine.max_running_reqs, from_file.scheduler.max_prefill_tokens) == (3, 2048)
    from_env = load_worker_config(None, {"RADIXQ_MAX_PREFILL_TOKENS": "512"}, {"engine.device": "cpu"})
    assert (from_env.engine.max_running_reqs, from_env.scheduler.max_prefill_tokens) == (
        CPU_DEFAULTS["engine.max_running_reqs"],
        512,
    )
    # auto keeps the GPU-sized values until the device is known; resolved to cpu it gets the CPU ones.
    auto = load_worker_config(None, {}, {"engine.max_prefill_tokens": 1024})
    assert auto.engine.max_running_reqs == gpu_sized.max_running_reqs
    on_cpu, on_cuda = auto.for_device("cpu"), auto.for_device("cuda")
    assert (on_cpu.engine.device, on_cpu.engine.max_running_reqs, on_cpu.scheduler.max_prefill_tokens) == (
        "cpu",
        CPU_DEFAULTS["engine.max_running_reqs"],
        1024,
    )
    assert on_cuda.engine == dataclasses.replace(auto.engine, device="cuda")
    # The bundled CPU config says what a CPU worker gets anyway, or more.
    bundled = load_worker_config(REPO_ROOT / "configs" / "smollm2-cpu.toml", {}, {})
    assert bundled.queue.read_window == 0 and bundled.engine.device == "cpu"


def test_worker_help_names_the_toml_tables() -> None:
    # NOTE: typer renders help as rich markup, where an unescaped "[worker]" is a style tag
    done = radixq("worker", "--help", env=subprocess_env(COLUMNS="200"))
    assert done.returncode == 0, done.stderr
    assert "Worker TOML file: [worker], [queue], [engine] tables." in done.stdout
    assert "--config's [worker], [queue] and [engine] tables" in done.stdout


def test_backend_is_a_deprecated_alias_of_generator_that_warns() -> None:
    """--backend and RADIXQ_BACKEND still name the generator, with a warning each ("backend"
    is the attention backend's word); the bad read window shows the setting was read on."""
    flag = radixq("worker", "--backend", "tests.fake_generator:create_generator", "--read-window", "-3")
    env = radixq(
        "worker",
        "--read-window",
        "-3",
        env=subprocess_env(RADIXQ_BACKEND="tests.fake_generator:create_generator"),
    )
    for done, older in ((flag, "--backend"), (env, "RADIXQ_BACKEND")):
        assert done.returncode == 2
        warning, error = done.stderr.strip().splitlines()
        assert warning.startswith(f"warning: {older} is deprecated") and "generator" in warning, warning
        assert error.startswith("error: setting [queue] read_window"), error
    fake = "tests.fake_generator:create_generator"
    assert load_worker_config(None, {"RADIXQ_BACKEND": fake}, {}).worker.generator == fake
    assert (
        load_worker_config(None, {"RADIXQ_BACKEND": "x:y", "RADIXQ_GENERATOR": fake}, {}).worker.generator
        == fake
    )


def test_every_side_reads_the_queue_and_redis_url_from_the_variables_wire_declares() -> None:
    """The worker's settings, the client CLI and `radixq run`'s workers take the queue and the
    Redis URL from wire.keys' names (one declaration; the health check, which reads them through
    env_queue / env_redis_url, runs in tests/integration/test_docker_healthcheck.py)."""
    from producer.cli import QueueOption, RedisUrlOption
    from producer.runner import worker_env
    from wire.keys import (
        DEFAULT_QUEUE,
        DEFAULT_REDIS_URL,
        QUEUE_ENV,
        REDIS_URL_ENVS,
        env_queue,
        env_redis_url,
    )
    from worker.config import settings

    by_key = {s.dotted: s for s in settings()}
    assert by_key["worker.queue"].env == (QUEUE_ENV,)
    assert by_key["worker.redis_url"].env == REDIS_URL_ENVS
    assert QueueOption.__metadata__[0].envvar == QUEUE_ENV
    assert tuple(RedisUrlOption.__metadata__[0].envvar) == REDIS_URL_ENVS
    env = worker_env("redis://h:1/0")
    assert env[REDIS_URL_ENVS[0]] == "redis://h:1/0" and REDIS_URL_ENVS[1] not in env
    assert env_redis_url({}) == DEFAULT_REDIS_URL and env_queue({}) == DEFAULT_QUEUE
    assert env_redis_url({"REDIS_URL": "redis://b", "RADIXQ_REDIS_URL": "redis://a"}) == "redis://a"
    assert env_redis_url({"REDIS_URL": "redis://b", "RADIXQ_REDIS_URL": ""}) == "redis://b"
    assert env_queue({QUEUE_ENV: "q1"}) == "q1"


@pytest.mark.parametrize("s", settings(), ids=lambda s: s.dotted)
def test_a_bad_flag_value_is_named_by_the_flag_the_setting_declares(s: Setting) -> None:
    """Issue 32: `--served-model-name` (its declared flag), not `--served-model-names` (its key)."""
    with pytest.raises(ConfigError) as info:
        load_worker_config(None, {}, {s.dotted: object()})  # no setting's type takes an object
    assert f"(from {s.flags[0].split('/')[0]})" in str(info.value)
