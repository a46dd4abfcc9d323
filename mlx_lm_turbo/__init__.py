"""TurboQuant KV-cache compression for mlx-lm."""

from .cache import TurboKV, TurboQuantKVCache, TurboQuantRotatingKVCache
from .prompt_cache import make_prompt_cache
from .schemes import KVScheme, parse_scheme

__all__ = [
    "KVScheme", "TurboKV", "TurboQuantKVCache", "TurboQuantRotatingKVCache",
    "make_prompt_cache", "parse_scheme",
]
