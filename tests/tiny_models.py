"""Tiny random-weight models of each target architecture, written as mlx-lm model
directories (config.json, model.safetensors, a tokenizer built here), offline."""

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

VOCAB = 262  # the tiny GGUF tokenizer's size (tests/test_gguf_and_demo.py)

CONFIGS = {
    "llama": dict(
        model_type="llama",
        hidden_size=256,
        num_hidden_layers=6,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        rms_norm_eps=1e-5,
    ),
    "llama_hd80": dict(
        model_type="llama",
        hidden_size=160,
        num_hidden_layers=6,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=80,
        rms_norm_eps=1e-5,
    ),
    "qwen3": dict(
        model_type="qwen3",
        hidden_size=128,
        num_hidden_layers=6,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    ),
    "qwen3_5": dict(
        model_type="qwen3_5",
        text_config=dict(
            model_type="qwen3_5_text",
            hidden_size=128,
            num_hidden_layers=8,
            intermediate_size=256,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=256,
            linear_num_value_heads=2,
            linear_num_key_heads=1,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            full_attention_interval=4,
            tie_word_embeddings=True,
            vocab_size=VOCAB,
        ),
    ),
    "qwen3_5_moe": dict(
        model_type="qwen3_5_moe",
        text_config=dict(
            model_type="qwen3_5_moe_text",
            hidden_size=128,
            num_hidden_layers=4,
            intermediate_size=256,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=256,
            linear_num_value_heads=2,
            linear_num_key_heads=1,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            full_attention_interval=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
            tie_word_embeddings=True,
            vocab_size=VOCAB,
        ),
    ),
    "nemotron_h": dict(
        model_type="nemotron_h",
        hidden_size=128,
        intermediate_size=256,
        max_position_embeddings=4096,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=128,
        attention_bias=False,
        mamba_num_heads=4,
        mamba_head_dim=32,
        mamba_proj_bias=False,
        ssm_state_size=16,
        conv_kernel=4,
        n_groups=1,
        mlp_bias=False,
        layer_norm_epsilon=1e-5,
        use_bias=False,
        use_conv_bias=True,
        hybrid_override_pattern=list("M*-M*E"),
        moe_intermediate_size=64,
        moe_shared_expert_intermediate_size=64,
        n_group=1,
        n_routed_experts=4,
        n_shared_experts=1,
        topk_group=1,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        time_step_limit=[0.0, 1e9],
    ),
    "gemma4_text": dict(
        model_type="gemma4_text",
        hidden_size=128,
        num_hidden_layers=6,
        intermediate_size=256,
        num_attention_heads=2,
        head_dim=256,
        global_head_dim=512,
        num_key_value_heads=1,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=VOCAB,
        sliding_window=16,
        sliding_window_pattern=3,
        use_double_wide_mlp=False,
        max_position_embeddings=4096,
    ),
    "gpt_oss": dict(
        model_type="gpt_oss",
        num_hidden_layers=4,
        num_local_experts=4,
        num_experts_per_tok=2,
        hidden_size=128,
        intermediate_size=128,
        head_dim=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"] * 2,
    ),
}
CONFIGS["gemma4"] = dict(
    model_type="gemma4",
    vocab_size=VOCAB,
    text_config={**CONFIGS["gemma4_text"], "vocab_size": VOCAB},
)
# CPU runs MoE (GatherMM) only in float32.
FLOAT32 = {"qwen3_5_moe", "nemotron_h", "gpt_oss"}
ARCHITECTURES = tuple(CONFIGS)


def build_model_dir(name, root: Path, tokenizer_dir: Path) -> Path:
    config = {"vocab_size": VOCAB, **CONFIGS[name]}
    out = Path(root) / name
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True)
    model_class, args_class = _get_classes(config)
    mx.random.seed(sum(map(ord, name)))
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.float32 if name in FLOAT32 else mx.float16)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, {"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer_dir) / f, out / f)
    return out
