"""``radixq serve``: the OpenAI Batch API and the dashboard over one queue (service.app)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from producer.cli import QueueOption, RedisUrlOption, resolve_redis_url
from service.config import API_KEYS_ENV, DEFAULT_MAX_FILE_BYTES, DEFAULT_PORT, ServeConfig, env_api_keys
from wire import exits
from wire.exits import fail
from wire.keys import DEFAULT_QUEUE


def serve(
    queue: QueueOption = DEFAULT_QUEUE,
    redis_url: RedisUrlOption = None,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            envvar="RADIXQ_SERVE_HOST",
            help="Address to listen on (loopback only without an API key).",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", envvar="RADIXQ_SERVE_PORT", help="Port to listen on.")
    ] = DEFAULT_PORT,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            "--api-key", help=f"A bearer key clients must send (repeat; env {API_KEYS_ENV}, comma-separated)."
        ),
    ] = None,
    data_dir: Annotated[
        Path,
        typer.Option(
            "--data-dir",
            envvar="RADIXQ_SERVE_DATA_DIR",
            help="Local folder for batches being collected "
            "(share it between replicas that take over each other's batches).",
        ),
    ] = Path("radixq-serve"),
    files_url: Annotated[
        str,
        typer.Option(
            "--files-url",
            envvar="RADIXQ_SERVE_FILES_URL",
            help="Where file bytes live: a folder or an s3:// / gs:// URL (default: DATA_DIR/files).",
        ),
    ] = "",
    max_file_bytes: Annotated[
        int, typer.Option("--max-file-bytes", envvar="RADIXQ_SERVE_MAX_FILE_BYTES", help="Largest upload.")
    ] = DEFAULT_MAX_FILE_BYTES,
    completion_window_s: Annotated[
        float | None,
        typer.Option(
            "--completion-window-s",
            envvar="RADIXQ_SERVE_COMPLETION_WINDOW_S",
            help="Seconds every batch has, whatever its completion_window says (default: the window's own).",
        ),
    ] = None,
    poll_s: Annotated[
        float, typer.Option("--poll-s", min=0.05, help="How often a batch's collector looks for results.")
    ] = 0.5,
    sample_s: Annotated[
        int, typer.Option("--sample-s", help="The dashboard's throughput plot: seconds between samples.")
    ] = 10,
    trim_results: Annotated[
        bool,
        typer.Option(
            "--trim-results",
            envvar="RADIXQ_SERVE_TRIM_RESULTS",
            help="Trim the queue's results stream whenever no batch is active: for a queue only the "
            "service uses (a plain collect on it would find results gone).",
        ),
    ] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error.")] = "info",
) -> None:
    """Serve the OpenAI Batch API (/v1/files, /v1/batches, /v1/models) and a live dashboard (/)
    over QUEUE: batches go onto the queue the workers read; output and error files are written
    as rows finish. Stateless beside Redis and the file storage: restart it, or run two."""
    keys = tuple(api_key or ()) or env_api_keys(os.environ)
    try:
        config = ServeConfig(
            redis_url=resolve_redis_url(redis_url), queue=queue, host=host, port=port, api_keys=keys,
            data_dir=data_dir, files_url=files_url, max_file_bytes=max_file_bytes,
            completion_window_s=completion_window_s, poll_s=poll_s, sample_s=sample_s, trim_results=trim_results,
        )  # fmt: skip
    except ValueError as exc:
        fail(str(exc), exits.USAGE)
    import uvicorn

    from service.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    access = (
        "API keys required"
        if config.auth_required
        else "no API key: listening on loopback only, anyone on this host may call it"
    )
    print(
        f"radixq serve: queue {config.queue!r} at {config.redis_url}, on http://{host}:{port} ({access}); "
        f"files in {config.files}, batches collected in {config.work_dir}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level.lower(), access_log=False)
