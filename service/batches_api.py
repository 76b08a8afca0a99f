"""``/v1/batches`` (create, retrieve, list, cancel) and ``/v1/models``."""

from __future__ import annotations

import json
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from producer.openai_request import CHAT_URL, COMPLETIONS_URL
from service.config import window_seconds
from service.context import Context
from service.errors import ApiError, bad_request, not_found
from service.files_api import found_file, int_param, page
from service.models import announced
from service.records import FINAL, BatchRecord, new_id, now_s

ENDPOINTS = (CHAT_URL, COMPLETIONS_URL)
MAX_METADATA_PAIRS = 16  # as OpenAI: 16 keys of up to 64 characters, values of up to 512
CANCELLABLE = frozenset({"validating", "in_progress"})


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_PAIRS:
        raise bad_request(
            f"metadata must be an object of at most {MAX_METADATA_PAIRS} pairs", param="metadata"
        )
    for key, item in value.items():
        if len(key) > 64 or not isinstance(item, str) or len(item) > 512:
            raise bad_request(
                "metadata keys have at most 64 characters, values are strings of at most 512",
                param="metadata",
            )
    return value


async def create_batch(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    body = await _json(request)
    return await run_in_threadpool(_create_batch, ctx, body)  # NOTE: Redis calls stay off the event loop


def _create_batch(ctx: Context, body: dict[str, Any]) -> Response:
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise bad_request("input_file_id is required", param="input_file_id")
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise bad_request(
            f"endpoint {endpoint!r} is not supported: {' or '.join(ENDPOINTS)}", param="endpoint"
        )
    window = body.get("completion_window")
    seconds = window_seconds(window) if isinstance(window, str) else None
    if seconds is None or not isinstance(window, str):
        raise bad_request(
            f"completion_window {window!r}: must be '24h' (radixq also takes N s, m or h: '2h', '30m')",
            param="completion_window",
        )
    metadata = _metadata(body.get("metadata"))
    unknown = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"})
    if unknown:
        raise bad_request(f"unknown parameter: {unknown[0]}", param=unknown[0], code="unknown_parameter")
    file = found_file(ctx, file_id)
    if file.purpose != "batch":
        raise bad_request(f"file {file_id} has purpose {file.purpose!r}, not 'batch'", param="input_file_id")
    other = [url for url in file.urls if url != endpoint]
    if other:
        raise bad_request(
            f"file {file_id} holds requests to {other[0]}, and this batch's endpoint is {endpoint}",
            param="endpoint",
            code="mismatched_endpoint",
        )
    models = announced(ctx.redis, ctx.keys)
    missing = sorted(set(file.models) - models.served) if models.checked else []
    if missing:
        raise ApiError(
            404,
            f"The model {missing[0]!r} does not exist or is not served by this queue's workers "
            f"(they serve: {', '.join(models.names())})",
            param="model",
            code="model_not_found",
        )
    created = now_s()
    lasts_s = ctx.config.completion_window_s if ctx.config.completion_window_s is not None else seconds
    record = BatchRecord(
        id=new_id("batch_"),
        endpoint=endpoint,
        input_file_id=file_id,
        completion_window=window,
        status="validating",
        created_at=created,
        expires_at=created + max(1, round(lasts_s)),
        total=file.lines,
        metadata=metadata,
    )
    ctx.records.create_batch(record)
    return JSONResponse(record.to_openai((0, 0)))


def _found(ctx: Context, batch_id: str) -> BatchRecord:
    record = ctx.records.batch(batch_id)
    if record is None:
        raise not_found("Batch", batch_id, param="batch_id")
    return record


def retrieve_batch(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    record = _found(ctx, request.path_params["batch_id"])
    return JSONResponse(record.to_openai(ctx.records.counts([record.id]).get(record.id)))


def list_batches(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    limit = int_param(request, "limit", 20, 1, 100)
    records, more = ctx.records.batches(request.query_params.get("after"), limit)
    counts = ctx.records.counts([r.id for r in records if r.status not in FINAL])
    return JSONResponse(page([r.to_openai(counts.get(r.id)) for r in records], more))


def cancel_batch(request: Request) -> Response:
    """A batch validating or in progress becomes ``cancelling``; the service that collects it
    cancels its jobs on the queue and moves it to ``cancelled`` once every row is written."""
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    batch_id = request.path_params["batch_id"]

    def cancelling(record: BatchRecord) -> None:
        record.status, record.cancelling_at = "cancelling", now_s()

    record, _ = ctx.records.move(batch_id, CANCELLABLE, cancelling)
    if record is None:
        raise not_found("Batch", batch_id, param="batch_id")
    if record.status not in ("cancelling", "cancelled"):
        raise ApiError(409, f"Cannot cancel a batch with status {record.status!r}.", param="batch_id")
    return JSONResponse(record.to_openai(ctx.records.counts([record.id]).get(record.id)))


def list_models(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    names = announced(ctx.redis, ctx.keys).names()
    return JSONResponse({"object": "list", "data": [_model(name) for name in names]})


def retrieve_model(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    name = request.path_params["model"]
    if name not in announced(ctx.redis, ctx.keys).names():
        raise ApiError(404, f"The model {name!r} does not exist", param="model", code="model_not_found")
    return JSONResponse(_model(name))


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "radixq"}
