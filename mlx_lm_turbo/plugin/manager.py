"""The plugin manager, set up as pytest sets up its own.

The built-in adapters (``builtin.py``) are registered first and
directly; installed plugins, found through the ``mlx_lm_turbo`` entry-point
group, are registered after them. pluggy asks the plugins registered last first,
so a third-party adapter for a model type wins over the built-in one. Hooks are
called through pluggy's own hook caller (each implementation gets the arguments
it declares; wrappers wrap). A plugin that fails to load or to validate is
unregistered with one warning naming it; mlx-lm keeps working.
"""

import warnings
from functools import lru_cache
from importlib.metadata import entry_points

import pluggy

from ..errors import UnsupportedModelError
from . import hookspecs
from .adapters import model_type_of
from .builtin import builtin_plugins


def _register_installed(pm, entry_point):
    plugin = None
    try:
        plugin = entry_point.load()
        if pm.is_registered(plugin):  # metadata of an older install listing a built-in
            return
        pm.register(plugin, name=entry_point.name)
        pm.check_pending()  # a hook name no spec knows (a typo) fails here, not silently
        if not pm.get_hookcallers(
            plugin
        ):  # e.g. the entry point names the module, not its plugin
            raise ValueError(f"it implements none of the {hookspecs.PROJECT} hooks")
    except Exception as error:  # a broken plugin must not break mlx-lm
        if plugin is not None and pm.is_registered(plugin):
            pm.unregister(plugin)
        warnings.warn(
            f"mlx-lm-turbo: plugin {entry_point.name!r} ({entry_point.value}) failed and is "
            f"skipped: {error!r}",
            stacklevel=2,
        )


@lru_cache(maxsize=None)
def plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, plugin in builtin_plugins():
        pm.register(plugin, name=f"mlx_lm_turbo.{name}")
    for entry_point in entry_points(group=hookspecs.PROJECT):
        _register_installed(pm, entry_point)
    return pm


def adapter_for(model):
    model_type = model_type_of(model)
    adapter = plugin_manager().hook.mlx_lm_turbo_adapter(
        model_type=model_type, model=model
    )
    if adapter is None:
        raise UnsupportedModelError(
            f"No mlx-lm-turbo adapter handles model type {model_type!r}; run it without --kv-scheme."
        )
    return adapter


def all_adapters():
    """(plugin name, adapter) for every adapter plugins list, in the order they are asked."""
    pm = plugin_manager()
    listed = []
    for impl in reversed(pm.hook.mlx_lm_turbo_adapters.get_hookimpls()):
        others = [p for p in pm.get_plugins() if p is not impl.plugin]
        for provided in pm.subset_hook_caller(
            "mlx_lm_turbo_adapters", remove_plugins=others
        )():
            listed += [(impl.plugin_name, a) for a in provided or ()]
    return listed
