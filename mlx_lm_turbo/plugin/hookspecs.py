"""The mlx-lm-turbo plugin API.

A plugin is a module (or object) with functions named after the hooks below,
marked with ``mlx_lm_turbo.hookimpl``, and published under the entry-point
group ``mlx_lm_turbo``::

    [project.entry-points.mlx_lm_turbo]
    my_family = "my_package.turbo_plugin"

An implementation may take fewer arguments than the spec names, or be a
``hookimpl(wrapper=True)`` generator, as pluggy allows. An adapter plugin can
simply export ``plugin = AdapterPlugin(Adapter(...))``, as each built-in
adapter (``mlx_lm_turbo/plugin/builtin.py``) is; those are registered first, so an
installed plugin serving the same model type takes over. A plugin that fails to
import or validate is skipped with one warning naming it; mlx-lm keeps working.
``hookimpl``, ``Adapter``, ``AdapterPlugin``, ``Capabilities`` and
``OverrideRegistry`` are importable from ``mlx_lm_turbo``.
"""

import pluggy

PROJECT = "mlx_lm_turbo"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def mlx_lm_turbo_adapter(model_type: str, model):
    """Return the ``Adapter`` (see ``mlx_lm_turbo.plugin.adapters``) that knows how to
    give this model TurboQuant caches, or None to let other plugins answer.

    Called with the model's ``model_type`` (from its config) and the loaded
    mlx-lm model. The first non-None answer wins; installed plugins are asked
    before the built-in adapters, so a third-party adapter takes over a built-in one.
    """


@hookspec
def mlx_lm_turbo_register_overrides(registry):
    """Add per-model overrides to ``registry`` (a ``mlx_lm_turbo.plugin.registry.OverrideRegistry``):
    a default scheme, boundary skip, per-layer schemes or an opt-out, matched by
    model type or by model path / repo-id pattern. Called once, when the registry
    is first built."""


@hookspec
def mlx_lm_turbo_adapters():
    """Return the adapters this plugin provides, for ``mlx-lm-turbo doctor``'s listing."""
