"""The model names the queue's live workers announce in their heartbeats (wire.status).

A worker started with served names (``--served-model-name``) answers to those only; one without
answers to any name with its own model (its heartbeat's ``model``). So a batch's models are
checked only when every live worker has served names; ``/v1/models`` lists each served name,
and the model of each worker without served names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from wire.keys import QueueKeys
from wire.status import Heartbeat, decode_heartbeat, is_alive, now_ms

# NOTE: a heartbeat alone decides here (no XINFO): a worker that has not read yet still counts
_NEVER_READ_MS = 1 << 62


@dataclass(frozen=True)
class Announced:
    served: frozenset[str]  # names live workers with served names answer to
    open_models: frozenset[str]  # models of live workers that answer to any name

    @property
    def checked(self) -> bool:
        """Whether a batch's models can be checked: some worker announces names, none takes any."""
        return bool(self.served) and not self.open_models

    def names(self) -> list[str]:
        return sorted(self.served | self.open_models)


def live_heartbeats(client: redis.Redis, keys: QueueKeys) -> list[Heartbeat]:
    beats: Any = client.hgetall(keys.workers)
    at_ms = now_ms()
    live = []
    for data in beats.values():
        beat = decode_heartbeat(data)
        if beat is not None and is_alive(beat, _NEVER_READ_MS, at_ms)[0] and beat.state == "running":
            live.append(beat)
    return live


def announced(client: redis.Redis, keys: QueueKeys) -> Announced:
    served: set[str] = set()
    open_models: set[str] = set()
    for beat in live_heartbeats(client, keys):
        if beat.served_models:
            served.update(beat.served_models)
        elif beat.model:
            open_models.add(beat.model)
    return Announced(frozenset(served), frozenset(open_models))
