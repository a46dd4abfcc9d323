"""Refusal by structure: every model module of the installed mlx-lm is served or refused
with the reason, read from its source, and loaded models get the same verdict."""

import re
from pathlib import Path

import mlx.core as mx
import mlx_lm.models
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache
from mlx_lm.utils import _get_classes
from tiny_models import ARCHITECTURES

import mlx_lm_turbo.cache.attention as attention
from mlx_lm_turbo import UnsupportedModelError, make_prompt_cache
from mlx_lm_turbo.plugin.adapters import model_module_verdicts

SMALL = dict(
    vocab_size=64,
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=64,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    rms_norm_eps=1e-5,
)
# Tiny configs of modules outside the target architectures: three the plugin must refuse
# (plamo2 calls mx.fast.scaled_dot_product_attention itself, gemma2 computes attention by
# hand, deepseek_v3 keeps a latent cache) and one a hand-kept list used to refuse by name.
OTHER_MODELS = {
    "plamo2": dict(
        hidden_size_per_head=32,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_num_heads=2,
        mamba_step=2,
        mamba_chunk_size=16,
    ),
    "gemma2": dict(query_pre_attn_scalar=32),
    "deepseek_v3": dict(
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=16,
        v_head_dim=32,
        qk_nope_head_dim=16,
        n_routed_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        first_k_dense_replace=2,
    ),
    "bailing_moe": dict(
        head_dim=64,
        max_position_embeddings=256,
        moe_intermediate_size=32,
        num_experts=2,
        num_shared_experts=1,
        norm_topk_prob=True,
        num_experts_per_tok=1,
        rope_theta=10000.0,
        first_k_dense_replace=2,
    ),
}


def other_model(model_type):
    config = {**SMALL, "model_type": model_type, **OTHER_MODELS[model_type]}
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    return model_class(args_class.from_dict(config))


def test_every_model_module_is_served_or_refused_with_the_reason():
    root = Path(mlx_lm.models.__path__[0])
    modules = {
        p.stem
        for p in root.glob("*.py")
        if re.search(r"^class Model\(", p.read_text(), re.M)
    }
    verdicts = model_module_verdicts()
    assert set(verdicts) == modules and len(modules) > 100
    for name, why in verdicts.items():
        assert why is None or (isinstance(why, str) and why), name
    served = {name for name, why in verdicts.items() if why is None}
    assert {
        "llama",
        "qwen3",
        "qwen3_5",
        "qwen3_next",
        "nemotron_h",
        "gemma4",
        "gemma4_text",
        "gpt_oss",
        "bailing_moe",
    } <= served
    refused = {name: why for name, why in verdicts.items() if why}
    assert (
        refused["plamo2"]
        == "Attention.__call__ calls mx.fast.scaled_dot_product_attention itself"
    )
    assert (
        "uses the cached 'keys' outside mlx-lm's scaled_dot_product_attention"
        in refused["gemma2"]
    )
    assert (
        "'k_pe' outside" in refused["deepseek_v3"]
        and "'keys_and_values'" in refused["gemma3n"]
    )
    assert (
        refused["llama4"]
        == "it keeps a ChunkedKVCache, which TurboQuant cannot compress"
    )
    assert refused["mamba"] == "it has no KV-cache layers to compress"


def count_turbo_attention(monkeypatch):
    calls = []
    original = attention.turbo_scaled_dot_product_attention
    monkeypatch.setattr(
        attention,
        "turbo_scaled_dot_product_attention",
        lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs),
    )
    return calls


def loaded(name, tiny_model):
    if name in OTHER_MODELS:
        return other_model(name), name
    model, _ = load(str(tiny_model(name)))
    return model, type(model).__module__.rsplit(".", 1)[-1]


@pytest.mark.parametrize("name", [*ARCHITECTURES, *OTHER_MODELS])
def test_a_loaded_model_gets_its_modules_verdict(name, tiny_model, monkeypatch):
    """Served: every attention call goes through the compressed path. Refused: the message
    names the model type and the reason, and says what to do. No third outcome."""
    model, module = loaded(name, tiny_model)
    why = model_module_verdicts()[module]
    if why:
        with pytest.raises(UnsupportedModelError) as refused:
            make_prompt_cache(model, "turbo4")
        assert str(refused.value) == (
            f"mlx-lm-turbo cannot serve model type {model.model_type!r}: {why}. "
            "Run it without --kv-scheme."
        )
        return
    calls = count_turbo_attention(monkeypatch)
    tokens = mx.array([[5, 9, 2, 7, 11, 3, 8]])
    cache = make_prompt_cache(model, "turbo4", boundary_skip=0)
    mx.eval(model(tokens, cache=cache))
    compressed = [c for c in cache if hasattr(c, "codec")]
    assert compressed and len(calls) >= len(compressed)
    if (
        name in OTHER_MODELS
    ):  # a decode step over compressed history stays close to fp16
        fp16, turbo8 = (
            mlx_make_prompt_cache(model),
            make_prompt_cache(model, "turbo8", boundary_skip=0),
        )
        for c in (fp16, turbo8):
            model(tokens[:, :-1], cache=c)
        last = tokens[:, -1:]
        assert mx.allclose(
            model(last, cache=turbo8), model(last, cache=fp16), atol=0.05
        ).item()
