"""NemotronH: Mamba blocks keep their state (ArraysCache), MLP/MoE blocks have no cache,
attention blocks are compressed. The cache list is shorter than the block list (the
model walks it with a counter), which the plan follows as is."""

from ..adapters import Adapter, AdapterPlugin, Capabilities

ADAPTER = Adapter(
    name="nemotron_h",
    model_types=("nemotron_h",),
    capabilities=Capabilities(notes="Mamba state untouched; attention layers compressed"),
)

plugin = AdapterPlugin(ADAPTER)
