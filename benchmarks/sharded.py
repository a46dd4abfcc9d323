"""TurboQuant caches under mx.distributed on the real model (issue 15): KL of a sharded
run against one process, where the difference comes from, and per-rank bytes and speed.

Each run prefills a slice of Pride and Prejudice, then decodes teacher-forced, once with
mlx-lm's own cache ("none"; this model runs in float32) and once per scheme, and writes into OUT/NAME/: rank 0's
log-probabilities, every rank's cache bytes and timings, and every rank's stored keys
per layer and global KV head (the float keys for "none", codebook indices for a scheme).

    # one process, and 3 tensor ranks (SmolLM2: 3 KV heads, so 1 or 3 ranks)
    python benchmarks/sharded.py run OUT/tp1
    mlx.launch -n 3 --backend ring --hosts 127.0.0.1 -- benchmarks/sharded.py run OUT/tp3 --sharding tensor
    # pipeline (mlx-lm's llama has none: the same weights as a qwen2 model with zero q/k/v biases)
    python benchmarks/sharded.py run OUT/pp1 --as-qwen2
    mlx.launch -n 2 ... -- benchmarks/sharded.py run OUT/pp2 --sharding pipeline --as-qwen2
    # one process: the tensor group's arithmetic (o_proj / down_proj summed per shard), and
    # relative noise of a given size added to o_proj / down_proj outputs
    python benchmarks/sharded.py run OUT/split3 --split-sums 3
    python benchmarks/sharded.py run OUT/noise1e-4 --noise 1e-4
    # tables (KL against a reference run, differing codes per layer, bytes, tokens/s)
    python benchmarks/sharded.py report OUT tp1 tp3 split3 noise1e-4 ...
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache
from mlx_lm.utils import load_tokenizer, sharded_load

from mlx_lm_turbo import make_prompt_cache
from mlx_lm_turbo.codec.packing import unpack
from mlx_lm_turbo.tools.bench import BOOK
from mlx_lm_turbo.tools.gguf import demo_model_path
from mlx_lm_turbo.tools.quality import teacher_forced_logprobs


def qwen2_copy(model_dir: Path, root: Path) -> Path:
    """``model_dir`` (a llama) as a qwen2 model, which mlx-lm can pipeline: the same
    weights (linked) plus zero q/k/v biases, and the weight index sharded_load reads."""
    out = root / (model_dir.name + "-as-qwen2")
    if (out / "model.safetensors.index.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama", config["model_type"]
    config["model_type"] = "qwen2"
    (out / "config.json").write_text(json.dumps(config))
    for f in model_dir.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    weights = mx.load(str(model_dir / "model.safetensors"))
    (out / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    biases = {}
    for k, w in weights.items():
        if k.endswith(("q_proj.scales", "k_proj.scales", "v_proj.scales")):
            biases[k.replace(".scales", ".bias")] = mx.zeros(w.shape[:1], w.dtype)
    mx.save_safetensors(str(out / "model-biases.safetensors"), biases)
    files = {k: "model.safetensors" for k in weights}
    files.update({k: "model-biases.safetensors" for k in biases})
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": files}))
    return out


class Float32Embedding(nn.Module):
    """The embedding with a float32 output: the demo checkpoint's fp16 embedding feeds
    float32 layers, and a pipeline rank receives shaped like its own embedding output
    (``recv_like``), so the sender's float32 arrived as fp16 and read as NaN."""

    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding

    def __call__(self, x):
        return self.embedding(x).astype(mx.float32)

    def as_linear(self, x):
        return self.embedding.as_linear(x)


class SplitSums(nn.Module):
    """A row-sharded QuantizedLinear's arithmetic in one process: ``shards`` partial
    products over slices of the input, summed in the activation dtype (as all_sum does)."""

    def __init__(self, linear, shards):
        super().__init__()
        self.linear, self.shards = linear, shards

    def __call__(self, x):
        q = self.linear
        n_in = x.shape[-1]
        step = n_in // self.shards
        words, groups = (
            q.weight.shape[1] // self.shards,
            q.scales.shape[1] // self.shards,
        )
        total = None
        for s in range(self.shards):
            part = mx.quantized_matmul(
                x[..., s * step : (s + 1) * step],
                q.weight[:, s * words : (s + 1) * words],
                q.scales[:, s * groups : (s + 1) * groups],
                q.biases[:, s * groups : (s + 1) * groups],
                transpose=True,
                group_size=q.group_size,
                bits=q.bits,
            )
            total = part if total is None else total + part
        return total


class Noisy(nn.Module):
    """A linear layer whose output gets Gaussian noise of ``relative`` times its RMS."""

    def __init__(self, linear, relative, key):
        super().__init__()
        self.linear, self.relative, self.key = linear, relative, key

    def __call__(self, x):
        y = self.linear(x)
        self.key, sub = mx.random.split(self.key)
        rms = mx.sqrt(mx.mean(y.astype(mx.float32) ** 2, axis=-1, keepdims=True))
        noise = self.relative * rms * mx.random.normal(y.shape, key=sub)
        return (y + noise).astype(y.dtype)


def wrap_reductions(model, make):
    """Replace every layer's o_proj and down_proj (the tensor group's all_sum points)."""
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.o_proj = make(layer.self_attn.o_proj, 2 * i)
        layer.mlp.down_proj = make(layer.mlp.down_proj, 2 * i + 1)


def held_heads(model, group, sharding):
    """Global KV head numbers this rank's caches hold."""
    attention = next(layer for layer in model.model.layers if layer).self_attn
    if sharding == "tensor":
        return [
            group.rank() * attention.n_kv_heads + h for h in range(attention.n_kv_heads)
        ]
    return list(range(attention.n_kv_heads))


def held_layers(model, sharding):
    if sharding == "pipeline":
        return list(range(model.model.start_idx, model.model.end_idx))
    return list(range(len(model.model.layers)))


def stored_keys(cache, offset):
    """(H, T, D) keys as the cache holds them: the model's float keys, or codebook indices."""
    if hasattr(cache, "codec"):
        bits = cache.codec.scheme.key_bits
        codes = unpack(cache.stored[0][..., :offset, :], bits, cache.codec.key_dim)
        return np.array(codes[0].astype(mx.uint8))
    return np.array(cache.keys[0, :, :offset].astype(mx.float32))


def run(args):
    group = mx.distributed.init()
    rank, size = group.rank(), group.size()
    model_dir = Path(args.model or demo_model_path())
    # One tokenization for every run (a qwen2 copy's tokenizer splits this text otherwise).
    tokenizer = load_tokenizer(model_dir)
    if args.as_qwen2:
        if rank == 0:
            qwen2_copy(model_dir, Path(args.out).parent)
        mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu))  # written
        model_dir = qwen2_copy(model_dir, Path(args.out).parent)
    if size > 1:
        groups = {f"{args.sharding}_group": group}
        model, _ = sharded_load(str(model_dir), **groups)
    else:
        model, _ = load(str(model_dir))
    if args.as_qwen2:
        model.model.embed_tokens = Float32Embedding(model.model.embed_tokens)
    if args.split_sums:
        wrap_reductions(model, lambda linear, i: SplitSums(linear, args.split_sums))
    if args.noise:
        wrap_reductions(
            model,
            lambda linear, i: Noisy(linear, args.noise, mx.random.key(1000 + i)),
        )
    text = BOOK.read_text()
    start = len(text) // 10  # past the front matter
    n = args.prefill + args.decode + 1
    tokens = mx.array(tokenizer.encode(text[start : start + 12 * n])[:n])
    heads = held_heads(model, group, args.sharding)
    layers = held_layers(model, args.sharding)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "rank": rank,
        "size": size,
        "sharding": args.sharding if size > 1 else None,
        "model": str(model_dir),
        "heads": heads,
        "layers": [layers[0], layers[-1] + 1],
        "split_sums": args.split_sums,
        "noise": args.noise,
        "seed": args.seed,
        "prefill": args.prefill,
        "decode": args.decode,
        "schemes": {},
    }
    for scheme in ["none", *args.schemes]:
        for repeat in range(args.repeats):
            if scheme == "none":
                cache = mlx_make_prompt_cache(model)
            else:
                cache = make_prompt_cache(model, scheme, seed=args.seed)
            timings = {}
            logprobs = teacher_forced_logprobs(
                model, tokens, cache, args.prefill, timings=timings
            )
            mx.eval(logprobs)
            entry = result["schemes"].setdefault(scheme, {"runs": []})
            entry["runs"].append(
                {
                    "prefill_tokens_per_s": args.prefill / timings["prefill_seconds"],
                    "decode_tokens_per_s": args.decode / timings["decode_seconds"],
                }
            )
        offset = args.prefill + args.decode
        entry["rank_kv_bytes"] = sum(c.nbytes for c in cache)
        np.savez(
            out / f"keys_{scheme}_rank{rank}.npz",
            **{
                f"{layer}_{head}": keys
                for layer, c in zip(layers, cache)
                for head, keys in zip(heads, stored_keys(c, offset))
            },
        )
        if rank == 0:
            np.save(out / f"logprobs_{scheme}.npy", np.array(logprobs))
            np.save(out / "targets.npy", np.array(tokens[args.prefill + 1 :]))
    (out / f"result_rank{rank}.json").write_text(json.dumps(result, indent=1))
    print(f"rank {rank}: done", flush=True)


def load_run(root, name):
    runs = sorted((root / name).glob("result_rank*.json"))
    return [json.loads(p.read_text()) for p in runs]


def kl(reference, other):
    p = np.exp(reference)
    return float((p * (reference - other)).sum(axis=-1).mean())


def top1(reference, other):
    return float((reference.argmax(-1) == other.argmax(-1)).mean())


def keys_of(root, name, scheme):
    merged = {}
    for p in sorted((root / name).glob(f"keys_{scheme}_rank*.npz")):
        with np.load(p) as f:
            merged.update({k: f[k] for k in f.files})
    return merged


def code_differences(root, reference, name, scheme, n_layers):
    """Per layer: fraction of stored key codes (all heads, all tokens past the sinks'
    16) that differ from the reference run's; for "none" the relative RMS difference."""
    a, b = keys_of(root, reference, scheme), keys_of(root, name, scheme)
    rows = []
    for layer in range(n_layers):
        names = sorted(k for k in a if k.startswith(f"{layer}_") and k in b)
        x = np.stack([a[k] for k in names])[:, 16:]
        y = np.stack([b[k] for k in names])[:, 16:]
        if scheme == "none":
            x, y = x.astype(np.float32), y.astype(np.float32)
            rows.append(float(np.sqrt(((x - y) ** 2).mean() / (x**2).mean())))
        else:
            rows.append(float((x != y).mean()))
    return rows


def report(args):
    root = Path(args.out)
    reference, names = args.names[0], args.names
    first = load_run(root, reference)[0]
    schemes = list(first["schemes"])
    lines = [f"# {' '.join(sys.argv)}", ""]
    lines += [
        f"KL (nats/token) of each run against `{reference}` with the same cache, over "
        f"{first['decode'] + 1} teacher-forced predictions after a {first['prefill']}-token "
        "prefill; top-1 agreement in brackets.",
        "",
        "| run | ranks | " + " | ".join(schemes) + " |",
        "|---|---:|" + "---:|" * len(schemes),
    ]
    logprobs = {
        (n, s): np.load(root / n / f"logprobs_{s}.npy") for n in names for s in schemes
    }
    for name in names:
        ranks = load_run(root, name)
        cells = [
            f"{kl(logprobs[reference, s], logprobs[name, s]):.2e} "
            f"({top1(logprobs[reference, s], logprobs[name, s]):.3f})"
            for s in schemes
        ]
        lines.append(f"| {name} | {len(ranks)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "KL of each scheme against the uncompressed cache (`none`) in the same run:",
        "",
    ]
    lines += [
        "| run | " + " | ".join(schemes[1:]) + " |",
        "|---|" + "---:|" * (len(schemes) - 1),
    ]
    for name in names:
        cells = [
            f"{kl(logprobs[name, 'none'], logprobs[name, s]):.4f}" for s in schemes[1:]
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    n_layers = first["layers"][1] - first["layers"][0]
    lines += [
        "",
        f"Per layer, against `{reference}`: for `none` the relative RMS difference of "
        "the float keys, for a scheme the fraction of key codes that differ (tokens 16 on; "
        "the first 16 are kept exact).",
        "",
        "| run | scheme | " + " | ".join(str(i) for i in range(n_layers)) + " |",
        "|---|---|" + "---:|" * n_layers,
    ]
    for name in names[1:]:
        for s in schemes:
            rows = code_differences(root, reference, name, s, n_layers)
            lines.append(
                f"| {name} | {s} | " + " | ".join(f"{v:.1e}" for v in rows) + " |"
            )

    lines += [
        "",
        "Per rank: KV cache bytes after the run, prefill and decode tokens/s (median of "
        "the repeats; every rank of a run computes every token).",
        "",
        "| run | sharding | ranks | rank | layers | KV heads | scheme | KV bytes | prefill tok/s | decode tok/s |",
        "|---|---|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for name in names:
        for r in load_run(root, name):
            for s, e in r["schemes"].items():
                prefill = np.median([x["prefill_tokens_per_s"] for x in e["runs"]])
                decode = np.median([x["decode_tokens_per_s"] for x in e["runs"]])
                lines.append(
                    f"| {name} | {r['sharding'] or '-'} | {r['size']} | {r['rank']} | "
                    f"{r['layers'][0]}-{r['layers'][1] - 1} | "
                    f"{','.join(map(str, r['heads']))} | {s} | {e['rank_kv_bytes']} | "
                    f"{prefill:.0f} | {decode:.1f} |"
                )
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--model", default=None, help="default: the demo model (SmolLM2)")
    r.add_argument("--sharding", choices=("tensor", "pipeline"), default="tensor")
    r.add_argument("--as-qwen2", action="store_true")
    r.add_argument("--split-sums", type=int, default=0)
    r.add_argument("--noise", type=float, default=0.0)
    r.add_argument("--seed", type=int, default=0, help="the caches' rotation seed")
    r.add_argument("--schemes", nargs="+", default=["turbo4"])
    r.add_argument("--prefill", type=int, default=256)
    r.add_argument("--decode", type=int, default=64)
    r.add_argument("--repeats", type=int, default=1)
    p = sub.add_parser("report")
    p.add_argument("out")
    p.add_argument(
        "names", nargs="+", help="runs under OUT; the first is the reference"
    )
    args = parser.parse_args()
    {"run": run, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
