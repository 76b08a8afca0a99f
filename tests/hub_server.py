"""A local stand-in for the Hugging Face hub: the HTTP endpoints ``huggingface_hub``'s
``snapshot_download`` calls (read from huggingface_hub 2.4's ``_snapshot_download.py`` and
``hf_api.py``), serving model folders in the hub's layout. Point ``HF_ENDPOINT`` at ``url``.

    GET  /api/models/{org}/{name}[/revision/{rev}] {"id", "sha", "siblings": [{"rfilename"}]}
    GET  /api/models/{org}/{name}/tree/{sha}       [{"type": "file", "path", "size", "oid"}]
    HEAD /{org}/{name}/resolve/{rev}/{file}        X-Repo-Commit, ETag, Content-Length
    GET  /{org}/{name}/resolve/{rev}/{file}        the bytes

Anything else is a 404 (an unknown repo's with ``X-Error-Code: RepoNotFound``, as the hub
answers). ``requests`` records each request's method and path.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the one revision every repo has


class HubServer:
    """Serves ``repos`` (hub id -> folder) on a free loopback port from a daemon thread."""

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = unquote(urlparse(self.path).path)
                server.requests.append(f"{self.command} {path}")
                status, body, headers = server.answer(path)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()

    def files(self, repo: str) -> dict[str, bytes]:
        folder = self.repos[repo]
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}

    def answer(self, path: str) -> tuple[int, bytes, dict[str, str]]:
        as_json = {"Content-Type": "application/json"}
        for repo in self.repos:
            files = None
            info = path == f"/api/models/{repo}" or path.startswith(f"/api/models/{repo}/revision/")
            if info or path.startswith(f"/api/models/{repo}/tree/"):
                files = self.files(repo)
            if info:
                siblings = [{"rfilename": name} for name in files or {}]
                return 200, json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode(), as_json
            if path.startswith(f"/api/models/{repo}/tree/"):
                listing = [
                    {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in (files or {}).items()
                ]
                return 200, json.dumps(listing).encode(), as_json
            prefix = f"/{repo}/resolve/"
            if path.startswith(prefix):
                name = path[len(prefix) :].partition("/")[2]
                data = self.files(repo).get(name)
                if data is not None:
                    tag = f'"{hashlib.sha1(data).hexdigest()}"'
                    return 200, data, {"X-Repo-Commit": COMMIT, "ETag": tag}
        if path.startswith("/api/models/"):
            return 404, b'{"error": "Repository not found"}', {**as_json, "X-Error-Code": "RepoNotFound"}
        return 404, b'{"error": "not found"}', as_json
