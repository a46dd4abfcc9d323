"""Gemma 4 (``gemma4_text`` and the ``gemma4`` wrapper): sliding-window layers get the
compressed rotating cache, full layers the compressed cache. KV-shared layers own no
cache: they attend to what their donor's ``update_and_fetch`` returned, a ``TurboKV``,
which the attention dispatch recognises by type (the shared layer passes cache=None)."""

from ..adapters import Adapter, AdapterPlugin, Capabilities

ADAPTER = Adapter(
    name="gemma4",
    model_types=("gemma4", "gemma4_text"),
    capabilities=Capabilities(notes="donor layers compressed; KV-shared layers read the donor's compressed K/V"),
)

plugin = AdapterPlugin(ADAPTER)
