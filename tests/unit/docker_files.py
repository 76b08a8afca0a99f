"""The Docker files read the way Compose and Docker read them, for static checks (no engine here).

Compose loads each -f file, interpolates ``${VAR}`` values, merges it over the files before it
and validates the result against the Compose Specification's schema (compose-go's loader);
relative paths of every file resolve against the first file's folder. ``load_project`` does
the same for the forms these files use and refuses the others (a list overriding a list, an
interpolation form it does not know) rather than guess at their semantics.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_FILE = REPO_ROOT / "docker-compose.yml"
REDIS_PORT_FILE = REPO_ROOT / "docker" / "compose.redis-port.yml"
GPU_SERVICES = REPO_ROOT / "docker" / "gpu-services.py"
CPU_DOCKERFILE = REPO_ROOT / "Dockerfile"
GPU_DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile.gpu"
SCHEMA_DIR = REPO_ROOT / "tests" / "data" / "compose-spec"

# ${NAME}, ${NAME:-default}, ${NAME-default}, $$ (a literal $); anything else after a $ is refused.
_VARIABLE = re.compile(
    r"\$(?:(?P<dollar>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\})"
)


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """``value`` with its variables substituted as Compose does (compose-spec 12-interpolation)."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match["dollar"]:
            return "$"
        name, op = match["name"], match["op"]
        if op == ":-" and not env.get(name):
            return match["default"]
        if op == "-" and name not in env:
            return match["default"]
        return env.get(name, "")

    result = _VARIABLE.sub(substitute, value)
    leftover = _VARIABLE.sub("", value)
    if "$" in leftover:
        raise NotImplementedError(f"an interpolation form these checks do not model: {value!r}")
    return result


def merge(base: Any, override: Any, where: str = "") -> Any:
    """Mappings merge key by key; a scalar replaces; a sequence may only be added, not
    merged (Compose's rules differ per field, and these files never need them)."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, item in override.items():
            merged[key] = merge(base[key], item, f"{where}.{key}") if key in base else item
        return merged
    if isinstance(base, list) or isinstance(override, list):
        raise NotImplementedError(f"{where}: a sequence overridden by another file")
    return override


def load_project(*files: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The merged, interpolated model of ``files`` (an empty environment by default)."""
    project: dict[str, Any] = {}
    for path in files:
        project = merge(project, interpolate(yaml.safe_load(path.read_text()), env or {}))
    return project


def active_services(project: dict[str, Any], *profiles: str) -> dict[str, Any]:
    """Services ``up`` starts with these profiles: those with no profile or one of them."""
    return {
        name: service
        for name, service in project["services"].items()
        if not service.get("profiles") or set(service["profiles"]) & set(profiles)
    }


def generate_gpu_override(tmp_path: Path, *args: str) -> Path:
    """Run docker/gpu-services.py as a user would; the file it wrote."""
    output = tmp_path / "compose.gpus.yml"
    subprocess.run(
        [sys.executable, str(GPU_SERVICES), *args, "-o", str(output)], check=True, capture_output=True
    )
    return output


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    """The service's device reservations (empty when it reserves none)."""
    return service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


@dataclass(frozen=True)
class Mount:
    source: str
    target: str

    @property
    def is_named_volume(self) -> bool:
        return not self.source.startswith((".", "/", "~"))


def mounts(service: dict[str, Any]) -> list[Mount]:
    """The service's volumes, short syntax (SOURCE:TARGET[:MODE]) as these files write them."""
    found = []
    for entry in service.get("volumes", []):
        source, target, *_ = entry.split(":")
        found.append(Mount(source, target))
    return found


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str
    line: int

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form ENTRYPOINT/CMD/VOLUME."""
        value = json.loads(self.args)
        assert isinstance(value, list), f"line {self.line}: not exec form: {self.args}"
        return value


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions in order: comments dropped, backslash continuations joined."""
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        start = start if pending else number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), " ".join(args.split()), start))
        pending = ""
    assert not pending, f"{path}: ends inside a continued instruction"
    return instructions


def build_args(instructions: list[Instruction]) -> dict[str, str]:
    """ARG defaults (``ARG NAME=value``)."""
    found = {}
    for instruction in instructions:
        if instruction.keyword == "ARG":
            name, _, default = instruction.args.partition("=")
            found[name] = default
    return found


def dockerignore_excludes(relative_path: str) -> bool:
    """Whether .dockerignore keeps ``relative_path`` (or a folder above it) out of the context."""
    patterns = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not any(pattern.startswith("!") for pattern in patterns), "exceptions (!) are not modelled"
    parts = relative_path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        for prefix in prefixes:
            if fnmatch.fnmatchcase(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatchcase(prefix.split("/")[-1], pattern[3:]):
                return True
    return False
