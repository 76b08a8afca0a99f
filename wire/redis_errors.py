"""What a Redis error means for radixq: wait and retry, or stop with one clear line.

    transient  connection refused/reset, timeouts, LOADING, OOM at maxmemory, READONLY
               replica, MISCONF, TRYAGAIN, CLUSTERDOWN: Redis will (or may) come back;
               back off and retry, keeping what must be written.
    fatal      wrong password, ACL denial, TLS certificate verification: retrying cannot
               help; say what, where and what to do, and exit non-zero.
    other      anything else (a bug, a wrong key type): not ours to hide.

redis-py's AuthenticationError is a ConnectionError, so the order of the checks matters.
"""

from __future__ import annotations

import re
from typing import Literal

import redis

Kind = Literal["transient", "fatal", "other"]

_FATAL_TYPES = (
    redis.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
    redis.exceptions.NoPermissionError,
)
# NOTE: Redis 7.0 reports an ACL denial inside a script as a plain ERR with this text
_SCRIPT_DENIED = "can't run this command or subcommand"
_FATAL_WORDS = (
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    _SCRIPT_DENIED,
    "certificate verify failed",
    "CERTIFICATE_VERIFY_FAILED",
)
_TRANSIENT_TYPES = (
    redis.ConnectionError,  # includes BusyLoadingError (LOADING)
    redis.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)
_TRANSIENT_PREFIXES = (
    "LOADING",
    "OOM",
    "READONLY",
    "MISCONF",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "NOREPLICAS",
)


class FatalRedisError(Exception):
    """A Redis error retrying cannot fix; ``str()`` is the one line to show the user."""


def classify(exc: BaseException) -> Kind:
    """transient, fatal or other (see the module docstring)."""
    if not isinstance(exc, redis.RedisError):
        return "other"
    text = str(exc)
    if isinstance(exc, _FATAL_TYPES) or any(word in text for word in _FATAL_WORDS):
        return "fatal"
    if isinstance(exc, _TRANSIENT_TYPES) or text.startswith(_TRANSIENT_PREFIXES):
        return "transient"
    if isinstance(exc, redis.exceptions.ExecAbortError) and "OOM" in text:
        return "transient"
    return "other"


def redact(url: str) -> str:
    """The URL without its password (``redis://user:***@host:port/db``)."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def check_url(url: str) -> None:
    """ValueError, saying why in one line (password redacted), when redis-py cannot use ``url``."""
    from redis.connection import parse_url

    scheme, sep, rest = url.partition("://")
    if sep and scheme.endswith("+cluster"):  # wire.cluster
        url = f"{scheme.removesuffix('+cluster')}://{rest}"
    try:
        parse_url(url)
    except ValueError as exc:
        raise ValueError(f"{redact(url)!r}: {exc}") from None


def url_of(client: redis.Redis) -> str:
    """The client's address as a URL without its password, for messages (a cluster client:
    its default node's)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        node = client.get_default_node()  # type: ignore[attr-defined]
        return f"redis://{node.host}:{node.port} (cluster)"
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    scheme = "rediss" if "ssl_cert_reqs" in kwargs else "redis"
    user = f"{kwargs['username']}@" if kwargs.get("username") else ""
    return (
        f"{scheme}://{user}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
    )


# redis-py prefixes an error inside a pipeline with the command, payload bytes included
_PIPELINE_NOTE = re.compile(r"^Command # \d+ \(.*\) of pipeline caused error: ", re.DOTALL)


def describe(exc: BaseException, url: str) -> str:
    """One line: what went wrong, where, and what to do about it."""
    where = redact(url)
    text = " ".join(_PIPELINE_NOTE.sub("", str(exc)).split()) or type(exc).__name__
    if isinstance(
        exc, (redis.AuthenticationError, redis.exceptions.AuthenticationWrongNumberOfArgsError)
    ) or any(word in text for word in ("NOAUTH", "WRONGPASS")):
        hint = "check the password in --redis-url (redis://user:password@host:port/db)"
    elif isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM" in text or _SCRIPT_DENIED in text:
        hint = _permission_hint(text)
    elif "certificate verify failed" in text or "CERTIFICATE_VERIFY_FAILED" in text:
        hint = "the server's TLS certificate was not trusted (ssl_ca_certs=... in the rediss:// URL)"
    elif isinstance(exc, redis.exceptions.OutOfMemoryError) or text.startswith("OOM"):
        hint = "Redis is at maxmemory: collect results (which trims them) or raise maxmemory"
    elif text.startswith(("MOVED", "ASK", "CROSSSLOT")):
        hint = "a Redis Cluster node answered a plain client: name it as redis+cluster://host:port"
    elif isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        hint = "is redis-server running there? (set --redis-url or RADIXQ_REDIS_URL)"
    else:
        hint = ""
    return f"redis at {where}: {text}" + (f"; {hint}" if hint else "")


_DENIED_COMMAND = re.compile(r"run the '([^']+)' command")


def _permission_hint(text: str) -> str:
    """What an ACL denial lacks: the command Redis named (as an ACL rule adds it), or radixq's
    key pattern; docs/permissions.md has each radixq command's rule."""
    named = _DENIED_COMMAND.search(text)
    if named is not None:
        lacks = f": +{named.group(1).lower()}"
    elif "key" in text:
        lacks = ": its key pattern must cover radixq's keys (~radixq:*)"
    else:
        lacks = ""
    return f"the Redis user lacks a permission radixq needs{lacks} (docs/permissions.md)"
