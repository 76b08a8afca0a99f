"""Memory of `radixq serve` while it takes a large batch file: its RSS against the file's size.

Writes an OpenAI batch file of the given size (chat requests of about 1 KB each, unique
custom_ids), starts `radixq serve` on a private redis-server, uploads the file with the
official `openai` client (`files.create`, as a user would) and samples the service's resident
memory (/proc/PID/status VmRSS) every 50 ms while the upload runs; its peak (VmHWM) is read
when the upload has answered. The service streams the body into storage and checks each line
as it goes (service.upload, service.lines), so its memory should not follow the file's size.

    python benchmarks/serve_upload.py --gb 1          # the figure in docs/performance.md
    python benchmarks/serve_upload.py --gb 0.1 0.5 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from producer.local_redis import LocalRedis, free_port  # noqa: E402

TARGET_MB = 200.0


def write_batch(path: Path, size_bytes: int) -> int:
    """An OpenAI batch file of at least ``size_bytes``; its line count."""
    text = "Summarise the following passage in one sentence. " * 18
    written = lines = 0
    with open(path, "w") as out:
        while written < size_bytes:
            body = {
                "model": "any",
                "messages": [{"role": "user", "content": f"{text}#{lines}"}],
                "max_tokens": 64,
            }
            line = json.dumps(
                {
                    "custom_id": f"req-{lines:09d}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
            )
            out.write(line + "\n")
            written += len(line) + 1
            lines += 1
    return lines


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure(path: Path, redis_url: str, data_dir: Path) -> dict[str, float]:
    import httpx
    import openai

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixq", "serve", "--redis-url", redis_url, "--port", str(port),
         "--data-dir", str(data_dir), "--log-level", "warning"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("radixq serve did not start")
            time.sleep(0.1)
        idle_mb = status_kb(proc.pid, "VmRSS") / 1024
        samples: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                samples.append(status_kb(proc.pid, "VmRSS") / 1024)

        sampler = threading.Thread(target=sample, daemon=True)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)
        start = time.monotonic()
        sampler.start()
        with open(path, "rb") as source:
            uploaded = client.files.create(file=source, purpose="batch")
        elapsed_s = time.monotonic() - start
        done.set()
        sampler.join()
        assert uploaded.bytes == path.stat().st_size, uploaded
        return {
            "file_mb": path.stat().st_size / 1e6,
            "idle_rss_mb": idle_mb,
            "peak_rss_mb": status_kb(proc.pid, "VmHWM") / 1024,
            "sampled_max_mb": max(samples, default=idle_mb),
            "upload_s": elapsed_s,
            "mb_per_s": path.stat().st_size / 1e6 / elapsed_s,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gb", type=float, nargs="+", default=[1.0], help="file sizes (GB, 1e9 bytes)")
    options = parser.parse_args()
    rows = []
    with (
        LocalRedis(use_server=True) as server,
        tempfile.TemporaryDirectory(prefix="radixq-upload-") as folder,
    ):
        for gb in options.gb:
            path = Path(folder) / "batch.jsonl"
            lines = write_batch(path, int(gb * 1e9))
            result = measure(path, server.url, Path(folder) / f"data-{gb}")
            result["lines"] = lines
            rows.append(result)
            path.unlink()
            print(json.dumps(result), flush=True)
    print(f"\n| file | lines | idle RSS | peak RSS (VmHWM) | upload | under {TARGET_MB:.0f} MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ok = "yes" if r["peak_rss_mb"] < TARGET_MB else "NO"
        print(f"| {r['file_mb']:,.0f} MB | {r['lines']:,.0f} | {r['idle_rss_mb']:.0f} MB | {r['peak_rss_mb']:.0f} MB "
              f"| {r['upload_s']:.0f} s ({r['mb_per_s']:.0f} MB/s) | {ok} |")  # fmt: skip


if __name__ == "__main__":
    main()
