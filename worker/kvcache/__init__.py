"""KV page allocation and prefix caches (radix tree, naive)."""

from worker.kvcache.allocator import PageAllocator
from worker.kvcache.prefix import Match, PrefixCache, create_prefix_cache

__all__ = ["Match", "PageAllocator", "PrefixCache", "create_prefix_cache"]
