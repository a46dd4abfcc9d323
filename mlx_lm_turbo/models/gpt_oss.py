"""GPT-OSS: attention sinks and alternating sliding / full layers. Sinks work on the
portable path (the key-centring shift is added back per query); the fused decode
kernel has no sink support yet, so ``-compact`` schemes are refused for this family."""

from ..adapters import Adapter, Capabilities
from ..hookspecs import hookimpl

ADAPTER = Adapter(
    name="gpt_oss",
    model_types=("gpt_oss",),
    capabilities=Capabilities(supports_attention_sinks=True, supports_compact=False,
                              notes="the fused decode kernel does not handle attention sinks"),
)


@hookimpl
def mlx_lm_turbo_adapter(model_type, model):
    return ADAPTER if model_type in ADAPTER.model_types else None


@hookimpl
def mlx_lm_turbo_adapters():
    return [ADAPTER]
