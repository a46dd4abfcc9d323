"""The plugin manager: built-in adapters and third-party plugins, loaded from entry points."""

import warnings
from functools import lru_cache
from importlib.metadata import entry_points

import pluggy

from . import hookspecs
from .adapters import model_type_of
from .errors import UnsupportedModelError

ENTRY_POINT_GROUP = hookspecs.PROJECT
BUILTIN_PLUGINS = {  # mirrored in pyproject.toml's entry points
    "kv_cache": "mlx_lm_turbo.models.kv_cache:plugin",
    "qwen3_5": "mlx_lm_turbo.models.qwen3_5:plugin",
    "nemotron_h": "mlx_lm_turbo.models.nemotron_h:plugin",
    "gemma4": "mlx_lm_turbo.models.gemma4:plugin",
    "gpt_oss": "mlx_lm_turbo.models.gpt_oss:plugin",
    "unsupported": "mlx_lm_turbo.models.unsupported:plugin",
}


def _warn(plugin, error):
    warnings.warn(f"mlx-lm-turbo: plugin {plugin!r} failed and is skipped: {error!r}", stacklevel=3)


@lru_cache(maxsize=None)
def plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as error:  # a broken plugin must not break mlx-lm
            _warn(f"{ep.name} ({ep.value})", error)
    # Running from a source tree without installed metadata: the built-ins still count.
    import importlib

    for name, target in BUILTIN_PLUGINS.items():
        if pm.get_plugin(name) is None:
            module, attribute = target.split(":")
            pm.register(getattr(importlib.import_module(module), attribute), name=name)
    return pm


def _call_each(hook_name, **kwargs):
    """Call a hook's implementations one by one (pluggy's order), skipping broken ones."""
    pm = plugin_manager()
    for impl in reversed(getattr(pm.hook, hook_name).get_hookimpls()):
        try:
            yield impl.plugin_name, impl.function(**kwargs)
        except UnsupportedModelError:
            raise
        except Exception as error:
            _warn(impl.plugin_name, error)


def adapter_for(model):
    model_type = model_type_of(model)
    for _, adapter in _call_each("mlx_lm_turbo_adapter", model_type=model_type, model=model):
        if adapter is not None:
            return adapter
    raise UnsupportedModelError(
        f"No mlx-lm-turbo adapter handles model type {model_type!r}; run it without --kv-scheme."
    )


def all_adapters():
    adapters = []
    for plugin, provided in _call_each("mlx_lm_turbo_adapters"):
        adapters += [(plugin, a) for a in provided or ()]
    return adapters
