"""Qwen3.5 / Qwen3.5-MoE / Qwen3-Next: gated-delta linear-attention layers keep their
recurrent state (ArraysCache); only the full-attention layers are compressed, and the
boundary layers are the first and last *attention* layers."""

from ..adapters import Adapter, AdapterPlugin, Capabilities

ADAPTER = Adapter(
    name="qwen3_5",
    model_types=("qwen3_5", "qwen3_5_moe", "qwen3_next"),
    capabilities=Capabilities(notes="linear-attention state untouched; full-attention layers compressed"),
)

plugin = AdapterPlugin(ADAPTER)
