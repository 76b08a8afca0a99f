"""KV page allocation and prefix caches (radix tree, naive)."""

from worker.cache.allocator import PageAllocator
from worker.cache.prefix import Match, PrefixCache, create_prefix_cache

__all__ = ["Match", "PageAllocator", "PrefixCache", "create_prefix_cache"]
