"""The settings of ``radixq serve``, built once at the edge (flags over environment) and frozen.

--host/--port           where it listens; without an API key only a loopback host is allowed
--api-key / RADIXQ_API_KEYS (comma-separated)   the bearer keys every /v1 call must carry
--data-dir              local folder: the batches being collected (rows, spill, lock)
--files-url             where file bytes live (a folder or an fsspec URL; default DATA/files)
--max-file-bytes        the largest upload
--completion-window-s   the time a batch has, whatever its completion_window says (tests)
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wire.keys import DEFAULT_QUEUE

API_KEYS_ENV = "RADIXQ_API_KEYS"
DEFAULT_PORT = 8000
DEFAULT_MAX_FILE_BYTES = 2 << 30  # 2 GiB, past OpenAI's 200 MB per batch file
WINDOWS_S = {"24h": 86_400.0}  # the completion windows OpenAI accepts
_WINDOW = re.compile(r"^([1-9][0-9]{0,5})([smh])$")  # radixq's own: "90m", "2h", "30s"
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}


def window_seconds(window: str) -> float | None:
    """The seconds a ``completion_window`` gives ("24h" as OpenAI; also N s/m/h), or None."""
    if window in WINDOWS_S:
        return WINDOWS_S[window]
    match = _WINDOW.match(window)
    return int(match.group(1)) * _UNIT_S[match.group(2)] if match else None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def env_api_keys(environ: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(key.strip() for key in environ.get(API_KEYS_ENV, "").split(",") if key.strip())


@dataclass(frozen=True)
class ServeConfig:
    redis_url: str
    queue: str = DEFAULT_QUEUE
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_keys: tuple[str, ...] = ()
    data_dir: Path = Path("radixq-serve")
    files_url: str = ""  # "" : data_dir / "files"
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    completion_window_s: float | None = None  # overrides every batch's window when set
    poll_s: float = 0.5  # how often a batch's collector looks for new results
    supervise_s: float = 1.0  # how often the supervisor looks for batches nobody collects
    retry_timeout_s: float = 60.0  # one Redis outage, before a batch's collect gives up a round
    sample_s: int = 10  # the throughput plot's sampling period
    trim_results: bool = False  # trim the results stream whenever no batch is active (a queue of its own)

    def __post_init__(self) -> None:
        if not self.api_keys and not is_loopback(self.host):
            raise ValueError(
                f"--host {self.host}: without an API key (--api-key or {API_KEYS_ENV}) radixq serve "
                "binds a loopback address only (127.0.0.1, ::1, localhost)"
            )
        if not 0 < self.port < 65536:
            raise ValueError(f"--port {self.port}: must be in [1, 65535]")
        if self.max_file_bytes <= 0:
            raise ValueError(f"--max-file-bytes {self.max_file_bytes}: must be > 0")
        if self.completion_window_s is not None and self.completion_window_s <= 0:
            raise ValueError(f"--completion-window-s {self.completion_window_s}: must be > 0")
        if not 1 <= self.sample_s <= 600:
            raise ValueError(f"--sample-s {self.sample_s}: must be in [1, 600]")
        if any(len(key) < 8 for key in self.api_keys):
            raise ValueError("an API key has at least 8 characters")

    @property
    def files(self) -> str:
        """Where file bytes live: a local folder or a URL."""
        return self.files_url or str(self.data_dir / "files")

    @property
    def work_dir(self) -> Path:
        """Local folder of the batches being collected (shared by services that take over)."""
        return self.data_dir / "work"

    @property
    def auth_required(self) -> bool:
        return bool(self.api_keys)
