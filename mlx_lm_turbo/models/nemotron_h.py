"""NemotronH: Mamba blocks keep their state (ArraysCache), MLP/MoE blocks have no cache,
attention blocks are compressed. The cache list is shorter than the block list (the
model walks it with a counter), which the plan follows as is."""

from ..adapters import Adapter, Capabilities
from ..hookspecs import hookimpl

ADAPTER = Adapter(
    name="nemotron_h",
    model_types=("nemotron_h",),
    capabilities=Capabilities(notes="Mamba state untouched; attention layers compressed"),
)


@hookimpl
def mlx_lm_turbo_adapter(model_type, model):
    return ADAPTER if model_type in ADAPTER.model_types else None


@hookimpl
def mlx_lm_turbo_adapters():
    return [ADAPTER]
