"""KV page allocation and prefix caches (radix tree, naive), re-exported lazily: the
torch-free ``worker.cache.names`` imports no torch."""

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

if TYPE_CHECKING:
    from worker.cache.allocator import PageAllocator
    from worker.cache.prefix import Match, PrefixCache, create_prefix_cache

__all__ = ["Match", "PageAllocator", "PrefixCache", "create_prefix_cache"]
__getattr__ = lazy_exports(
    __name__,
    {
        "PageAllocator": "worker.cache.allocator",
        "Match": "worker.cache.prefix",
        "PrefixCache": "worker.cache.prefix",
        "create_prefix_cache": "worker.cache.prefix",
    },
)
