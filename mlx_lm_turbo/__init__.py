"""TurboQuant KV-cache compression for mlx-lm.

Names load on first use, so the start-up hook that attaches the plugin to
mlx-lm does not pay for what a command never touches.
"""

import importlib

_EXPORTS = {
    "KVScheme": ".schemes", "parse_scheme": ".schemes",
    "TurboKV": ".cache", "TurboQuantKVCache": ".cache", "TurboQuantRotatingKVCache": ".cache",
    "make_prompt_cache": ".prompt_cache", "plan": ".prompt_cache",
    "UnsupportedModelError": ".errors",
    # the plugin API (mlx_lm_turbo/hookspecs.py)
    "hookimpl": ".hookspecs", "Adapter": ".adapters", "AdapterPlugin": ".adapters",
    "Capabilities": ".adapters", "OverrideRegistry": ".registry", "register_override": ".registry",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
