"""Models by Hugging Face hub id (``org/name``): found in the local Hugging Face cache, or
downloaded into it through ``huggingface_hub`` (``snapshot_download``, with its progress bars)
when the hub can be reached.

Which ``--model`` values are hub ids, decided before anything slow starts
(worker.preflight.check_model):

    exists on disk                    a path (file or folder)
    /x, ./x, ~/x, a.gguf, a/b/c       a path that is not there: refused
    an alias (worker.models.aliases) the bundled model
    org/name (one slash)              a hub id: from the cache, else downloaded
    anything else (``no-such-model``)  refused at once, unless the cache holds it

A download honours ``HF_HUB_OFFLINE`` (nothing is fetched), ``HF_ENDPOINT`` (the hub's
address), ``HF_HOME``/``HF_HUB_CACHE`` (where the cache is) and ``HF_TOKEN`` (private and gated
models); an id that is neither cached nor fetched is one line (HubUnavailable) naming the id
and the cache. Torch-free; ``huggingface_hub`` is imported when a hub id is looked up.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

# What a checkpoint directory needs: config, tokenizer files, chat template, weights.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]

# huggingface_hub's repo id rule, in short: one slash, each part of letters, digits, ``-_.``
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class HubUnavailable(Exception):
    """A hub id that is neither in the cache nor could be downloaded; ``str()`` is the one
    line to show."""


def is_hub_id(model: str) -> bool:
    """Whether ``model`` has the form of a hub id (``org/name``); it may still not exist."""
    return _HUB_ID.fullmatch(model) is not None and ".." not in model and "--" not in model


def cache_dir() -> str:
    """The Hugging Face hub cache (HF_HUB_CACHE, else $HF_HOME/hub)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def cached(repo_id: str) -> Path | None:
    """The complete cached snapshot of ``repo_id`` (its checkpoint files), None when the cache
    does not hold one. Reads the disk only."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=ALLOW_PATTERNS))
    except Exception:  # NOTE: not cached, partly cached, or a name the library refuses
        return None


def snapshot(repo_id: str, say: Callable[[str], None] | None = None) -> Path:
    """The local snapshot of ``repo_id``: the cached one, else downloaded (``say`` gets a line
    first; huggingface_hub draws its progress bars on stderr). Raises HubUnavailable."""
    found = cached(repo_id)
    if found is not None:
        return found
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    where = f"not in the Hugging Face cache {cache_dir()}"
    if constants.is_offline_mode():
        raise HubUnavailable(
            f"--model {repo_id!r}: {where}, and HF_HUB_OFFLINE is set (download it where the hub can be "
            f"reached: hf download {repo_id})"
        )
    try:  # NOTE: asked first, so a missing model or an unreachable hub is the only line shown
        HfApi().repo_info(repo_id)
        if say is not None:
            say(f"downloading {repo_id} from {constants.ENDPOINT} into {cache_dir()}")
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS))
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        gated = " (gated: accept its terms and set HF_TOKEN)" if isinstance(exc, GatedRepoError) else ""
        raise HubUnavailable(
            f"--model {repo_id!r}: {where}, and the hub at {constants.ENDPOINT} has no such model{gated} "
            "(a private one needs HF_TOKEN)"
        ) from None
    except Exception as exc:  # NOTE: no connection, a hub error (5xx), a failed transfer
        cause = exc.__cause__ or exc
        reason = f"{type(cause).__name__}: {cause}".splitlines()[0]
        raise HubUnavailable(
            f"--model {repo_id!r}: {where}, and it could not be downloaded from the hub at {constants.ENDPOINT} "
            f"({reason})"
        ) from None
