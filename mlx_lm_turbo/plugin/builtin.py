"""The built-in adapters: which model types each serves, and what it keeps as it is.

They differ only in data: ``Adapter`` itself plans and builds every family's caches
from what mlx-lm's own ``make_prompt_cache`` returns (state caches untouched, the
boundary layers counted over attention layers only). The manager registers them
first, each as a plugin of its own, so an installed plugin serving the same model
type takes over.
"""

from .adapters import Adapter, AdapterPlugin, Capabilities, FallbackAdapterPlugin

BUILTIN_ADAPTERS = (
    # Every other model: KVCache / RotatingKVCache layers, attention through mlx-lm's
    # scaled_dot_product_attention (llama, qwen3, mistral, phi3, ...); a model whose
    # source shows otherwise is refused with the reason. Asked last.
    Adapter(
        "kv_cache",
        ("*",),
        Capabilities(
            notes="any model whose make_prompt_cache yields KVCache/RotatingKVCache"
        ),
    ),
    # Gated-delta linear-attention layers keep their recurrent state (ArraysCache).
    Adapter(
        "qwen3_5",
        ("qwen3_5", "qwen3_5_moe", "qwen3_next"),
        Capabilities(
            notes="linear-attention state untouched; full-attention layers compressed"
        ),
    ),
    # Mamba blocks keep their state, MLP/MoE blocks have no cache: the cache list is
    # shorter than the block list (the model walks it with a counter).
    Adapter(
        "nemotron_h",
        ("nemotron_h",),
        Capabilities(notes="Mamba state untouched; attention layers compressed"),
    ),
    # KV-shared layers own no cache: they attend to the TurboKV their donor's
    # update_and_fetch returned, which the attention dispatch recognises by type.
    Adapter(
        "gemma4",
        ("gemma4", "gemma4_text"),
        Capabilities(
            notes="donor layers compressed; KV-shared layers read the donor's compressed K/V"
        ),
    ),
    # Learned attention sinks, honoured on both attention paths (the key-centring
    # shift moves the sink logit); alternating sliding / full layers.
    Adapter(
        "gpt_oss", ("gpt_oss",), Capabilities(notes="learned attention sinks honoured")
    ),
)


def builtin_plugins():
    """(name, plugin) for each built-in adapter, in registration order."""
    return [
        (
            a.name,
            (FallbackAdapterPlugin if a.model_types == ("*",) else AdapterPlugin)(a),
        )
        for a in BUILTIN_ADAPTERS
    ]
