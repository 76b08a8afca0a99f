"""``/v1/files``: upload (service.upload), list, retrieve, content, delete."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from service.context import Context
from service.driver import input_name
from service.errors import ApiError, bad_request, not_found
from service.records import FileRecord, new_id, now_s
from service.upload import receive

_CHUNK = 1 << 20
MAX_LIST = 10_000


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{name} must be an integer, not {raw!r}", param=name) from None
    if not low <= value <= high:
        raise bad_request(f"{name} must be in [{low}, {high}], not {value}", param=name)
    return value


def page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def found_file(ctx: Context, file_id: str) -> FileRecord:
    record = ctx.records.file(file_id)
    if record is None:
        raise not_found("File", file_id, param="file_id")
    return record


async def create_file(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > ctx.config.max_file_bytes + (1 << 16):
        raise ApiError(
            413,
            f"the file is larger than this service's limit of {ctx.config.max_file_bytes} bytes",
            param="file",
            code="file_too_large",
        )
    file_id = new_id("file-")
    upload = await receive(
        request.headers.get("content-type", ""),
        request.stream(),
        ctx.storage,
        input_name(file_id),
        ctx.config.max_file_bytes,
    )
    check = upload.check
    record = FileRecord(
        id=file_id,
        bytes=upload.size,
        created_at=now_s(),
        filename=upload.filename or "upload.jsonl",
        purpose="batch",
        lines=check.lines,
        models=[] if check.too_many_models else sorted(check.models),
        urls=sorted(check.urls),
    )
    await run_in_threadpool(ctx.records.put_file, record)  # NOTE: Redis calls stay off the event loop
    if check.invalid:
        ctx.log.info("file %s: %d of %d requests will get invalid_job rows (first: %s)",
                     file_id, check.invalid, check.lines, check.first_error)  # fmt: skip
    return JSONResponse(record.to_openai())


def list_files(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    limit = int_param(request, "limit", MAX_LIST, 1, MAX_LIST)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"order must be 'asc' or 'desc', not {order!r}", param="order")
    purpose = request.query_params.get("purpose")
    records, more = ctx.records.files(request.query_params.get("after"), limit, newest_first=order == "desc")
    data = [r.to_openai() for r in records if purpose is None or r.purpose == purpose]
    return JSONResponse(page(data, more))


def retrieve_file(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    return JSONResponse(found_file(ctx, request.path_params["file_id"]).to_openai())


def file_content(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    record = found_file(ctx, request.path_params["file_id"])
    try:
        reader = ctx.storage.reader(input_name(record.id))
    except FileNotFoundError:
        raise ApiError(
            404, f"the bytes of file {record.id} are no longer in storage", param="file_id"
        ) from None

    def chunks() -> Iterator[bytes]:
        with reader:
            while piece := reader.read(_CHUNK):
                yield piece

    return StreamingResponse(
        chunks(), media_type="application/jsonl", headers={"content-length": str(record.bytes)}
    )


def delete_file(request: Request) -> Response:
    ctx = Context.of(request)
    ctx.auth.check_api(request)
    record = found_file(ctx, request.path_params["file_id"])
    for batch_id in ctx.records.active():
        batch = ctx.records.batch(batch_id)
        if batch is not None and batch.input_file_id == record.id:
            raise ApiError(409, f"file {record.id} is the input of batch {batch_id}, which is not finished yet",
                           param="file_id")  # fmt: skip
    ctx.records.delete_file(record.id)
    ctx.storage.delete(input_name(record.id))
    return JSONResponse({"id": record.id, "object": "file", "deleted": True})
