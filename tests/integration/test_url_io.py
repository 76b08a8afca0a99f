"""Input and output by URL (issue 17, item 7), against real servers on loopback: Python's
http.server (GET for inputs, PUT for outputs, files kept in a folder) and moto's S3-compatible
server (ThreadedMotoServer, boto3 as the oracle for what the bucket holds). `radixq run` and
`radixq enqueue` + `collect` read and write URLs as they do local files: one row per input row,
in order, resumable from the remote copy.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from producer.local_redis import free_port
from tests.fake_generator import fake_text
from tests.integration.procs import FAKE_GENERATOR, radixq, start_worker, subprocess_env
from tests.waiting import LIVENESS_S

pytestmark = pytest.mark.integration


class _Files(http.server.SimpleHTTPRequestHandler):
    """GET serves the folder; PUT writes the body to the file named by the path."""

    protocol_version = "HTTP/1.1"

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        target = Path(self.directory) / self.path.lstrip("/")
        target.write_bytes(self._body())
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = bytearray()
        while size := int(self.rfile.readline().split(b";")[0], 16):  # RFC 9112 chunked coding
            body += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailer fields
            pass
        return bytes(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_folder(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, folder) of an HTTP server on loopback serving and accepting files."""
    folder = tmp_path / "served"
    folder.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *args: _Files(*args, directory=str(folder))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", folder
    server.shutdown()
    server.server_close()


@pytest.fixture
def s3() -> Iterator[dict[str, str]]:
    """The environment that points s3fs (and boto3) at a moto S3 server on loopback, with a
    bucket "results"."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    client.create_bucket(Bucket="results")
    env["_client"] = client  # type: ignore[assignment]
    yield env
    server.stop()


def s3_env(s3: dict[str, str]) -> dict[str, str]:
    return subprocess_env(**{k: v for k, v in s3.items() if not k.startswith("_")})


def s3_text(s3: dict[str, str], key: str) -> str:
    client = s3["_client"]
    return client.get_object(Bucket="results", Key=key)["Body"].read().decode()  # type: ignore[attr-defined]


def write_jobs(path: Path, count: int) -> list[str]:
    ids = [f"u{i}" for i in range(count)]
    path.write_text("".join(json.dumps({"id": i, "prompt": f"hello {i}"}) + "\n" for i in ids))
    return ids


def test_run_reads_https_style_input_and_writes_s3_output_then_resumes(
    http_folder: tuple[str, Path], s3: dict[str, str]
) -> None:
    base, folder = http_folder
    ids = write_jobs(folder / "in.jsonl", 6)
    env = s3_env(s3)
    args = [
        "run",
        f"{base}/in.jsonl",
        "-o",
        "s3://results/out.jsonl",
        "--generator",
        FAKE_GENERATOR,
        "--timeout",
        "60",
    ]
    done = radixq(*args, env=env)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in s3_text(s3, "out.jsonl").splitlines()]
    assert [row["id"] for row in rows] == ids and all(
        row["choices"][0]["text"] == fake_text(row["id"]) for row in rows
    )
    # more input lines: the next run resumes from the bucket's copy and adds only the new ones
    ids = write_jobs(folder / "in.jsonl", 9)
    again = radixq(*args, env=env)
    assert again.returncode == 0, again.stderr
    assert "wrote 3 results to s3://results/out.jsonl (6 were already there)" in again.stderr
    assert [json.loads(line)["id"] for line in s3_text(s3, "out.jsonl").splitlines()] == ids


def test_run_writes_parquet_and_errors_by_http_put(http_folder: tuple[str, Path], tmp_path: Path) -> None:
    base, folder = http_folder
    source = tmp_path / "in.jsonl"
    source.write_text(
        json.dumps({"id": "a", "prompt": "x"}) + "\n" + json.dumps({"id": "b", "prompt": ""}) + "\n"
    )
    done = radixq(
        "run",
        str(source),
        "-o",
        f"{base}/out.parquet",
        "--errors",
        f"{base}/errors.jsonl",
        "--generator",
        FAKE_GENERATOR,
        "--timeout",
        "60",
    )
    assert done.returncode == 1, done.stderr  # the rejected row
    table = pq.read_table(folder / "out.parquet").to_pylist()
    assert [(row["id"], row["text"]) for row in table] == [("a", fake_text("a"))]
    assert [
        json.loads(line)["id"] for line in (folder / "out.parquet.rows.jsonl").read_text().splitlines()
    ] == ["a"]
    (error,) = [json.loads(line) for line in (folder / "errors.jsonl").read_text().splitlines()]
    assert error["id"] == "b" and error["error"]["code"] == "invalid_job"


def test_enqueue_and_collect_by_url(
    redis_url: str, http_folder: tuple[str, Path], s3: dict[str, str], tmp_path: Path
) -> None:
    base, folder = http_folder
    ids = write_jobs(folder / "in.jsonl", 4)
    env = s3_env(s3)
    enqueued = radixq("enqueue", f"{base}/in.jsonl", "--redis-url", redis_url, env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    worker = start_worker(redis_url, "w", tmp_path / "w.log")
    try:
        collected = radixq(
            "collect", "-o", "s3://results/c.jsonl", "--redis-url", redis_url, "--timeout", "60", env=env
        )
    finally:
        worker.terminate()
        worker.wait(timeout=LIVENESS_S)
    assert collected.returncode == 0, collected.stderr
    assert [json.loads(line)["id"] for line in s3_text(s3, "c.jsonl").splitlines()] == ids


def test_unreadable_urls_are_one_line_errors(http_folder: tuple[str, Path], tmp_path: Path) -> None:
    base, _ = http_folder
    missing = radixq(
        "run", f"{base}/nope.jsonl", "-o", str(tmp_path / "o.jsonl"), "--generator", FAKE_GENERATOR
    )
    assert missing.returncode == 2
    (line,) = missing.stderr.strip().splitlines()
    assert line.startswith("error: ") and "nope.jsonl" in line
    unknown = radixq(
        "enqueue", "nosuchscheme://x/in.jsonl", "--redis-url", f"redis://127.0.0.1:{free_port()}/0"
    )
    assert (
        unknown.returncode == 2
        and unknown.stderr.startswith("error: ")
        and len(unknown.stderr.splitlines()) == 1
    )
    folder_input = radixq("enqueue", str(tmp_path), "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert (
        folder_input.returncode == 2
        and folder_input.stderr.strip() == f"error: {tmp_path}: is a folder, not an input file"
    )
