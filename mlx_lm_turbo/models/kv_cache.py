"""Every other model: KVCache / RotatingKVCache layers, attention through mlx-lm's
``scaled_dot_product_attention`` (llama, qwen3, mistral, phi3, ...); a model whose
source shows otherwise is refused with the reason. Asked last, so any
family-specific adapter takes precedence."""

from ..adapters import Adapter, Capabilities, FallbackAdapterPlugin

ADAPTER = Adapter(
    name="kv_cache",
    model_types=("*",),
    capabilities=Capabilities(notes="any model whose make_prompt_cache yields KVCache/RotatingKVCache"),
)

plugin = FallbackAdapterPlugin(ADAPTER)
