"""``radixq serve``: the OpenAI Batch API (``/v1/files``, ``/v1/batches``, ``/v1/models``) and a
live dashboard over one queue, stateless beside Redis and file storage (docs/serve.md)."""

from service.config import ServeConfig

__all__ = ["ServeConfig", "create_app"]


def create_app(config: ServeConfig):  # type: ignore[no-untyped-def]
    """The ASGI app (service.app.create_app; imported here lazily: starlette is the serve extra)."""
    from service.app import create_app as build

    return build(config)
