"""The ASGI application of ``radixq serve``: the OpenAI Batch API under ``/v1``, the dashboard
at ``/``, ``/health``, and the supervisor thread that drives the batches (its lifespan)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from service import batches_api, dashboard, files_api
from service.auth import Auth
from service.config import ServeConfig
from service.context import Context
from service.errors import ApiError, api_error_handler, http_error_handler, unavailable
from service.records import Records
from service.storage import Storage
from service.supervisor import Supervisor
from wire.keys import QueueKeys
from wire.redis_errors import describe
from wire.streams import connect

log = logging.getLogger("radixq.serve")


def health(request: Request) -> Response:
    """200 while Redis answers (a load balancer's or Kubernetes' probe), else 503."""
    ctx = Context.of(request)
    try:
        ctx.redis.ping()
    except redis.RedisError as exc:
        return JSONResponse(
            {"status": "unavailable", "redis": describe(exc, ctx.config.redis_url)}, status_code=503
        )
    return JSONResponse({"status": "ok", "queue": ctx.config.queue})


async def redis_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, redis.RedisError)
    return unavailable(f"Redis is unavailable: {exc}").response()


def create_app(config: ServeConfig, *, supervise: bool = True) -> Starlette:
    """The service; ``supervise`` False: the API alone, no batch is driven (tests of the API)."""
    client = connect(config.redis_url)
    keys = QueueKeys(config.queue)
    storage = Storage(config.files)
    records = Records(client, keys)
    ctx = Context(config, client, keys, records, storage, Auth(config.api_keys), log)
    supervisor = Supervisor(config, client, records, storage)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if supervise:
            supervisor.start()
        try:
            yield
        finally:
            supervisor.stop()
            client.close()

    routes = [
        Route("/health", health),
        Route("/v1/files", files_api.create_file, methods=["POST"]),
        Route("/v1/files", files_api.list_files, methods=["GET"]),
        Route("/v1/files/{file_id}", files_api.retrieve_file, methods=["GET"]),
        Route("/v1/files/{file_id}", files_api.delete_file, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", files_api.file_content, methods=["GET"]),
        Route("/v1/batches", batches_api.create_batch, methods=["POST"]),
        Route("/v1/batches", batches_api.list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", batches_api.retrieve_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", batches_api.cancel_batch, methods=["POST"]),
        Route("/v1/models", batches_api.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", batches_api.retrieve_model, methods=["GET"]),
        *dashboard.routes(),
        Mount("/static", StaticFiles(packages=[("service", "static")]), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: api_error_handler,
            HTTPException: http_error_handler,
            redis.RedisError: redis_error_handler,
        },
    )
    app.state.ctx = ctx
    app.state.supervisor = supervisor
    return app
