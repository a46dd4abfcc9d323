"""TurboQuant KV-cache compression for mlx-lm.

Layers, lowest first (a module imports only from its own layer or lower ones):
``errors``, ``compat``, ``defaults``, ``settings``; ``codec/`` (schemes, codebooks, rotation, bit
packing, the codec); ``kernels/`` (fused CUDA kernels beside their portable
references); ``cache/`` (the caches, ``TurboKV`` and attention); ``plugin/`` (the
plugin API, adapters, overrides, ``make_prompt_cache``); ``attach/`` (what the
start-up hook does to mlx-lm's commands); ``tools/`` (the ``mlx-lm-turbo`` command:
demo, bench, doctor, the GGUF converter).

Names load on first use, so the start-up hook that attaches the plugin to
mlx-lm does not pay for what a command never touches.
"""

import importlib

_EXPORTS = {
    "KVScheme": ".codec.schemes",
    "parse_scheme": ".codec.schemes",
    "TurboKV": ".cache.view",
    "TurboQuantKVCache": ".cache.kv_cache",
    "TurboQuantRotatingKVCache": ".cache.rotating_cache",
    "make_prompt_cache": ".plugin.prompt_cache",
    "plan": ".plugin.prompt_cache",
    "UnsupportedModelError": ".errors",
    # the plugin API (mlx_lm_turbo/plugin/hookspecs.py)
    "hookimpl": ".plugin.hookspecs",
    "Adapter": ".plugin.adapters",
    "AdapterPlugin": ".plugin.adapters",
    "Capabilities": ".plugin.adapters",
    "OverrideRegistry": ".plugin.registry",
    "register_override": ".plugin.registry",
}
__all__ = list(_EXPORTS)


# Caches made through the Python API need mlx-lm's attention routed to them even where
# the start-up hook did not run (MLX_LM_TURBO_DISABLE, an install without .pth files).
_ROUTED = {"TurboQuantKVCache", "TurboQuantRotatingKVCache", "make_prompt_cache"}


def __getattr__(name):
    if name in _EXPORTS:
        if name in _ROUTED:
            from .attach.attention import install_attention_dispatch

            install_attention_dispatch()
        # kept, so the next lookup finds it without coming back here
        value = globals()[name] = getattr(
            importlib.import_module(_EXPORTS[name], __name__), name
        )
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
