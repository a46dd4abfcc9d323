"""Gemma 4 (``gemma4_text`` and the ``gemma4`` wrapper): sliding-window layers get the
compressed rotating cache, full layers the compressed cache. KV-shared layers own no
cache: they attend to what their donor's ``update_and_fetch`` returned, a ``TurboKV``,
which the attention dispatch recognises by type (the shared layer passes cache=None)."""

from ..adapters import Adapter, Capabilities
from ..hookspecs import hookimpl

ADAPTER = Adapter(
    name="gemma4",
    model_types=("gemma4", "gemma4_text"),
    capabilities=Capabilities(supports_kv_sharing=True,
                              notes="donor layers compressed; KV-shared layers read the donor's compressed K/V"),
)


@hookimpl
def mlx_lm_turbo_adapter(model_type, model):
    return ADAPTER if model_type in ADAPTER.model_types else None


@hookimpl
def mlx_lm_turbo_adapters():
    return [ADAPTER]
