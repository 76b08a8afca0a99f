"""What every request handler of one service reaches: its settings, Redis, records, storage."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from starlette.requests import Request

from service.auth import Auth
from service.config import ServeConfig
from service.records import Records
from service.storage import Storage
from wire.keys import QueueKeys


@dataclass
class Context:
    config: ServeConfig
    redis: redis.Redis
    keys: QueueKeys
    records: Records
    storage: Storage
    auth: Auth
    log: logging.Logger

    @staticmethod
    def of(request: Request) -> Context:
        ctx = request.app.state.ctx
        assert isinstance(ctx, Context)
        return ctx
