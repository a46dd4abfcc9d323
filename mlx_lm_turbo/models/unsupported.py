"""Families TurboQuant cannot serve correctly: attention computed by the model itself
(bypassing mlx-lm's ``scaled_dot_product_attention``) or latent (MLA) caches. Refused
with a message that names the model type, never run silently in fp16."""

from ..adapters import Adapter, AdapterPlugin, Capabilities

MANUAL_ATTENTION = ("gemma2", "olmo", "gemma3n", "afm7", "deepseek_v32", "minimax_m3_vl")
LATENT_CACHES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_linear", "glm4_moe_lite",
                 "longcat_flash", "mistral4", "bailing_moe", "bailing_moe_linear")


def _refusing(name, model_types, why):
    return Adapter(
        name=name, model_types=model_types,
        capabilities=Capabilities(supports_turbo_quantization=False, notes=why),
        refusal=(f"mlx-lm-turbo does not support model type {{model_type!r}}: it {why}, so "
                 "TurboQuant caches would be bypassed or misread. Run it without --kv-scheme."),
    )


MANUAL = _refusing("manual_attention", MANUAL_ATTENTION,
                   "computes attention itself or reads cache internals")
LATENT = _refusing("latent_cache", LATENT_CACHES, "keeps a latent (MLA) cache, not per-head K/V")

plugin = AdapterPlugin(MANUAL, LATENT)
