"""The GGUF converter on a tiny llama GGUF written here, and the demo command on it."""

import json

import mlx.core as mx
import pytest
from mlx_lm import load
from tokenizers.pre_tokenizers import ByteLevel

from mlx_lm_turbo import demo
from mlx_lm_turbo.gguf import convert_gguf

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path, architecture="llama", layers=2, hidden=128, heads=2, kv_heads=1):
    alphabet = sorted(ByteLevel.alphabet())
    merges = ["h e", "l l", "he ll"]
    tokens = SPECIAL + alphabet + ["he", "ll", "hell"]
    mx.random.seed(0)
    w = lambda *shape: (0.05 * mx.random.normal(shape)).astype(mx.float32)
    head_dim = hidden // heads
    arrays = {"token_embd.weight": w(len(tokens), hidden), "output_norm.weight": mx.ones((hidden,))}
    for i in range(layers):
        arrays.update({
            f"blk.{i}.attn_q.weight": w(hidden, hidden), f"blk.{i}.attn_k.weight": w(kv_heads * head_dim, hidden),
            f"blk.{i}.attn_v.weight": w(kv_heads * head_dim, hidden), f"blk.{i}.attn_output.weight": w(hidden, hidden),
            f"blk.{i}.ffn_gate.weight": w(256, hidden), f"blk.{i}.ffn_up.weight": w(256, hidden),
            f"blk.{i}.ffn_down.weight": w(hidden, 256), f"blk.{i}.attn_norm.weight": mx.ones((hidden,)),
            f"blk.{i}.ffn_norm.weight": mx.ones((hidden,)),
        })
    u32 = lambda v: mx.array(v, dtype=mx.uint32)
    meta = {
        "general.architecture": architecture, "llama.block_count": u32(layers),
        "llama.embedding_length": u32(hidden), "llama.feed_forward_length": u32(256),
        "llama.attention.head_count": u32(heads), "llama.attention.head_count_kv": u32(kv_heads),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.context_length": u32(2048), "llama.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)), dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(1), "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.chat_template": TEMPLATE,
    }
    mx.save_gguf(str(path), arrays, meta)
    return path


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return convert_gguf(write_tiny_gguf(root / "tiny.gguf"), root / "model", progress=False)


def test_converted_model_loads_and_tokenizes(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 1
    assert config["rope_traditional"] is True and "quantization" not in config
    model, tokenizer = load(str(tiny_model_dir))
    ids = tokenizer.encode("hello", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids)[0] == "hell"  # merges applied
    assert tokenizer.decode(ids) == "hello"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|im_start|>assistant\n")
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 2 and tokenizer.eos_token == "<|im_end|>"
    assert model(mx.array([ids])).shape == (1, len(ids), config["vocab_size"])


def test_converter_refuses_other_architectures(tmp_path):
    path = write_tiny_gguf(tmp_path / "qwen.gguf", architecture="qwen2")
    with pytest.raises(ValueError, match="Only llama-architecture GGUF"):
        convert_gguf(path, tmp_path / "out", progress=False)


def test_demo_compares_fp16_and_turbo(tiny_model_dir, capsys):
    demo.main(["--model", str(tiny_model_dir), "--schemes", "turbo4", "turbo2", "--max-tokens", "8",
               "--prompt", "hello", "--boundary-skip", "0"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "KV bytes" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["uncompressed (float32)", "turbo4", "turbo2"]
    ratios = [float(r.split("|")[3].strip().rstrip("x")) for r in rows]
    # float32 baseline; both hold 256-token buffers here: turbo4 4.125/32 bits plus its
    # exact sink tokens (up to 16, held as given and in the attention domain: 32/256)
    assert ratios[0] == 1.0 and ratios[2] < ratios[1] < 0.27


def test_demo_rejects_bad_scheme_before_loading(capsys):
    with pytest.raises(ValueError, match="Did you mean turbo4"):
        demo.main(["--model", "/nonexistent", "--schemes", "turbo5"])
