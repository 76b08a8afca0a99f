"""KV page allocation and prefix caches (radix tree, naive), re-exported lazily: the
torch-free ``worker.kvcache.names`` imports no torch."""

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

if TYPE_CHECKING:
    from worker.kvcache.allocator import PageAllocator
    from worker.kvcache.prefix import Match, PrefixCache, create_prefix_cache

__all__ = ["Match", "PageAllocator", "PrefixCache", "create_prefix_cache"]
__getattr__ = lazy_exports(
    __name__,
    {
        "PageAllocator": "worker.kvcache.allocator",
        "Match": "worker.kvcache.prefix",
        "PrefixCache": "worker.kvcache.prefix",
        "create_prefix_cache": "worker.kvcache.prefix",
    },
)
