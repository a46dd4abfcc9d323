"""Whole-model speed of fp16 and TurboQuant KV caches, through mlx-lm's own generation.

A random-weight model of a named real shape (``--list-shapes``) is built from its
config through mlx-lm's model classes, no download: speed does not depend on the
weights. One sequence runs through ``mlx_lm.generate.generate_step`` as
``stream_generate`` runs it (a prompt of N random token ids prefilled in
``--prefill-step-size`` chunks, then D decode tokens); ``--batch B`` runs B prompts
through ``mlx_lm.generate.batch_generate`` instead. The fp16 cache is mlx-lm's own
``make_prompt_cache(model)``; a scheme's cache is the plugin's
``mlx_lm_turbo.make_prompt_cache(model, scheme)`` with the defaults the mlx-lm
commands use for ``--kv-scheme``.

fp16 and every scheme take turns in one process, ``--rounds`` rounds at each
context (fp16, turbo4, fp16, turbo4, ...) after a warm-up round at the smallest
context, since the device's speed moves between and within runs. Per run:

- one sequence: time to first token, prefill tokens/s (N / TTFT), decode tokens/s
  (the D tokens after the first);
- a batch: prefill and decode tokens/s as ``batch_generate`` counts them (its
  decode time includes each sequence's first token);
- both: KV cache bytes (the caches' ``nbytes`` after the run; a batch's are the
  per-sequence caches ``batch_generate`` returns; mlx-lm's fp16 caches grow 256 tokens
  at a time, which shows at short contexts) and peak memory above the weights
  (``mx.get_peak_memory()`` over the run, less the weights' bytes).

Each scheme's ratios to the fp16 run of the same round (prefill and decode speed,
KV bytes, peak memory) are reported as medians over the rounds, with the medians of
the measurements. ``--json PATH`` writes the device, versions, commit, command,
config, every run and the medians (rewritten after each run, so a long run that is
stopped keeps what it measured).

    python benchmarks/model_speed.py --shape llama-3.1-8b \\
        --contexts 4096 32768 131072 --schemes turbo4 turbo4v2 turbo3 turbo5v3 \\
        --rounds 3 --json results.json
    python benchmarks/model_speed.py --shape qwen3-8b --batch 8 --ragged \\
        --contexts 16384 --schemes turbo4
    python benchmarks/model_speed.py --shape tiny --contexts 256 --rounds 1
    # two of the 8B shape's layers on a CPU: float16 matmuls there take minutes
    python benchmarks/model_speed.py --shape llama-3.1-8b --layers 2 \\
        --contexts 256 --decode-tokens 8 --rounds 1
"""

import argparse
import datetime
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten
from mlx_lm.generate import (
    batch_generate,
    generate_step,
    generation_stream,
    wired_limit,
)
from mlx_lm.models.cache import make_prompt_cache

import mlx_lm_turbo

SHAPES = {
    "tiny": dict(
        model_type="llama",
        hidden_size=256,
        num_hidden_layers=4,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    ),
    "llama-3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        num_hidden_layers=32,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    ),
    "qwen3-8b": dict(
        model_type="qwen3",
        hidden_size=4096,
        num_hidden_layers=36,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
    # Gemma-3-12B's text model: 5 sliding-window layers (1024 tokens) to each global one.
    "gemma3-12b": dict(
        model_type="gemma3_text",
        hidden_size=3840,
        num_hidden_layers=48,
        intermediate_size=15360,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        vocab_size=262208,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rope_scaling=dict(rope_type="linear", factor=8.0),
        query_pre_attn_scalar=256,
        sliding_window=1024,
        sliding_window_pattern=6,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
    ),
}
# Small enough that the residual stream stays finite in float16 through every layer.
WEIGHT_STD = 0.02
MIB = 2**20


def say(message):
    print(f"[model_speed] {message}", file=sys.stderr, flush=True)


def build_model(config, dtype, seed):
    """The model of ``config`` with random weights, materialized one array at a time
    (peak memory near the model's size) and loaded as mlx-lm loads a checkpoint."""
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    mx.random.seed(seed)
    weights = {}
    for name, p in tree_flatten(model.parameters()):
        if config["tie_word_embeddings"] and name.startswith("lm_head."):
            continue
        # Norm weights keep their initial values: random ones would scale activations.
        if p.ndim > 1:
            w = mx.random.normal(p.shape, dtype=dtype, scale=WEIGHT_STD)
        else:
            w = p.astype(dtype)
        mx.eval(w)
        weights[name] = w
    model.load_weights(list(model.sanitize(weights).items()))
    model.eval()
    return model


def make_cache(model, scheme):
    if scheme is None:
        return make_prompt_cache(model)
    return mlx_lm_turbo.make_prompt_cache(model, scheme)


def kv_bytes(cache):
    return sum(c.nbytes for c in cache)


def run_single(model, scheme, prompt, decode_tokens, prefill_step_size):
    cache = make_cache(model, scheme)
    times = []
    mx.reset_peak_memory()
    with wired_limit(model, [generation_stream]):
        start = time.perf_counter()
        for _ in generate_step(
            prompt,
            model,
            max_tokens=decode_tokens + 1,
            prompt_cache=cache,
            prefill_step_size=prefill_step_size,
        ):
            times.append(time.perf_counter())
    ttft = times[0] - start
    return {
        "ttft_s": ttft,
        "prefill_tps": prompt.size / ttft,
        "decode_tps": decode_tokens / (times[-1] - times[0]),
        "kv_bytes": kv_bytes(cache),
        "peak_bytes": mx.get_peak_memory(),
    }


class NoTokenizer:
    """What batch_generate asks of a tokenizer: no stop tokens, so every sequence
    decodes all its tokens; no text."""

    eos_token_ids = ()

    def decode(self, tokens):
        return ""


def run_batch(model, scheme, prompts, decode_tokens, prefill_step_size):
    caches = [make_cache(model, scheme) for _ in prompts]
    mx.reset_peak_memory()
    response = batch_generate(
        model,
        NoTokenizer(),
        prompts,
        prompt_caches=caches,
        max_tokens=decode_tokens + 1,
        return_prompt_caches=True,
        prefill_step_size=prefill_step_size,
        prefill_batch_size=len(prompts),
        completion_batch_size=len(prompts),
    )
    stats = response.stats
    return {
        "prefill_tokens": stats.prompt_tokens,
        "prefill_s": stats.prompt_time,
        "prefill_tps": stats.prompt_tps,
        "decode_tokens": stats.generation_tokens,
        "decode_s": stats.generation_time,
        "decode_tps": stats.generation_tps,
        "kv_bytes": sum(kv_bytes(c) for c in response.caches),
        "peak_bytes": mx.get_peak_memory(),
    }


def prompt_lengths(context, batch, ragged):
    """Per sequence: ``context`` tokens, or with ``ragged`` evenly from ``context``
    down to about half of it."""
    if not ragged:
        return [context] * batch
    return [context - i * context // (2 * batch) for i in range(batch)]


def add_ratios(run, fp16):
    run["prefill_vs_fp16"] = run["prefill_tps"] / fp16["prefill_tps"]
    run["decode_vs_fp16"] = run["decode_tps"] / fp16["decode_tps"]
    run["kv_bytes_vs_fp16"] = run["kv_bytes"] / fp16["kv_bytes"]
    run["peak_vs_fp16"] = run["peak_bytes"] / fp16["peak_bytes"]


def medians(runs, caches):
    rows = []
    for context in dict.fromkeys(r["context"] for r in runs):
        for cache in caches:
            mine = [r for r in runs if r["context"] == context and r["cache"] == cache]
            if not mine:
                continue
            row = {"context": context, "cache": cache, "rounds": len(mine)}
            for key, value in mine[0].items():
                if key not in row and key != "round" and isinstance(value, float | int):
                    row[key] = statistics.median(r[key] for r in mine)
            rows.append(row)
    return rows


def table(rows, batch):
    ttft = "" if batch > 1 else f"{'TTFT s':>8}"
    lines = [
        f"{'context':>8} {'cache':<9}{ttft} {'prefill tok/s':>14} "
        f"{'decode tok/s':>13} {'KV MiB':>10} {'peak MiB':>10} {'prefill x':>10} "
        f"{'decode x':>9} {'KV x':>6} {'peak x':>7}"
    ]
    for row in rows:
        ratios = (
            f"{row['prefill_vs_fp16']:>9.2f}x {row['decode_vs_fp16']:>8.2f}x "
            f"{row['kv_bytes_vs_fp16']:>5.2f}x {row['peak_vs_fp16']:>6.2f}x"
            if "prefill_vs_fp16" in row
            else ""
        )
        ttft = "" if batch > 1 else f"{row['ttft_s']:>8.3f}"
        lines.append(
            f"{row['context']:>8} {row['cache']:<9}{ttft} {row['prefill_tps']:>14.1f} "
            f"{row['decode_tps']:>13.2f} {row['kv_bytes'] / MIB:>10.1f} "
            f"{row['peak_bytes'] / MIB:>10.1f} {ratios}"
        )
    return "\n".join(lines)


def git_commit():
    """The checkout's commit, marked where files differ from it; None outside git."""
    here = Path(__file__).parent

    def git(*args):
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=here
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return None
    return (commit + (" (uncommitted changes)" if dirty else "")) or None


def scheme_name(text):
    try:
        scheme = mlx_lm_turbo.parse_scheme(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if scheme is None:
        raise argparse.ArgumentTypeError(
            "fp16 (no scheme) is always run as the baseline; name turbo schemes only."
        )
    return scheme.name


def positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def setup_arg_parser():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="llama-3.1-8b",
        help="the model shape (default: llama-3.1-8b; --list-shapes describes them)",
    )
    parser.add_argument(
        "--list-shapes", action="store_true", help="describe the shapes and exit"
    )
    parser.add_argument(
        "--layers",
        type=positive,
        help="build only this many layers of the shape (a quick check on a small "
        "machine; its speeds are not the model's)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float16", "bfloat16"),
        default="float16",
        help="the weights' and activations' dtype (default: float16)",
    )
    parser.add_argument(
        "--schemes",
        type=scheme_name,
        nargs="+",
        default=["turbo4"],
        help="TurboQuant schemes to compare with fp16 (default: turbo4)",
    )
    parser.add_argument(
        "--contexts",
        type=positive,
        nargs="+",
        default=[4096, 32768, 131072],
        help="prompt tokens per sequence (default: 4096 32768 131072)",
    )
    parser.add_argument(
        "--decode-tokens",
        type=positive,
        default=64,
        help="tokens each sequence decodes after its first (default: 64)",
    )
    parser.add_argument(
        "--prefill-step-size",
        type=positive,
        default=2048,
        help="prompt tokens per prefill chunk, as mlx-lm's option (default: 2048)",
    )
    parser.add_argument(
        "--rounds",
        type=positive,
        default=3,
        help="timed rounds of every cache at each context (default: 3)",
    )
    parser.add_argument(
        "--batch",
        type=positive,
        default=1,
        help="sequences run together through batch_generate (default: 1, one "
        "sequence through generate_step)",
    )
    parser.add_argument(
        "--ragged",
        action="store_true",
        help="with --batch: prompts from the context's length down to about half "
        "of it, instead of all of it",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of weights and prompts (default: 0)"
    )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="write every run and the medians"
    )
    return parser


def list_shapes():
    for name, config in SHAPES.items():
        arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
        args = arch.ModelArgs.from_dict(config)
        window = (
            f", sliding window {args.sliding_window} (every {args.sliding_window_pattern}"
            "th layer global)"
            if hasattr(args, "sliding_window_pattern")
            else ""
        )
        print(
            f"{name}: {args.model_type}, {args.num_hidden_layers} layers, hidden "
            f"{args.hidden_size}, {args.num_attention_heads} q / "
            f"{args.num_key_value_heads} KV heads, head_dim {args.head_dim}, "
            f"intermediate {args.intermediate_size}, vocab {args.vocab_size}{window}"
        )


def _platform():
    """System, release and machine (platform.platform() starts ``uname -p`` for the
    processor's name)."""
    u = platform.uname()
    return f"{u.system}-{u.release}-{u.machine}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    if args.list_shapes:
        list_shapes()
        return
    if args.ragged and args.batch < 2:
        parser.error("--ragged needs --batch 2 or more")

    config = dict(SHAPES[args.shape])
    if args.layers:
        config["num_hidden_layers"] = args.layers
    caches = ["fp16", *dict.fromkeys(args.schemes)]
    info = mx.device_info()
    device = f"{info.get('device_name') or platform.machine()} ({mx.default_device()})"
    results = {
        "device": {"name": device, "platform": _platform(), **info},
        "versions": {
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
            "mlx_lm_turbo": importlib.metadata.version("mlx-lm-turbo"),
            "python": platform.python_version(),
        },
        "commit": git_commit(),
        "command": shlex.join(["python", "benchmarks/model_speed.py", *argv]),
        # the plugin's settings the run saw (MLX_LM_TURBO_KERNEL=on: unverified kernels)
        "environment": {
            k: v for k, v in os.environ.items() if k.startswith("MLX_LM_TURBO_")
        },
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        "config": {**vars(args), "json": str(args.json), "model": config},
        "runs": [],
        "medians": [],
    }

    say(f"building {args.shape} ({config['num_hidden_layers']} layers, {args.dtype})")
    model = build_model(config, getattr(mx, args.dtype), args.seed)
    weights = sum(p.nbytes for _, p in tree_flatten(model.parameters()))
    results["config"]["weights_bytes"] = weights
    say(f"weights {weights / MIB:.1f} MiB on {device}")

    key = mx.random.key(args.seed + 1)

    def prompts(context):
        lengths = prompt_lengths(context, args.batch, args.ragged)
        ids = mx.random.randint(0, config["vocab_size"], (sum(lengths),), key=key)
        if args.batch == 1:
            return ids
        ids = ids.tolist()
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        return [ids[s : s + n] for s, n in zip(starts, lengths)]

    def measure(cache_name, prompt):
        gc.collect()
        mx.clear_cache()
        run = (run_batch if args.batch > 1 else run_single)(
            model,
            mlx_lm_turbo.parse_scheme(cache_name) if cache_name != "fp16" else None,
            prompt,
            args.decode_tokens,
            args.prefill_step_size,
        )
        run["peak_bytes"] -= weights
        gc.collect()
        mx.clear_cache()
        return run

    warmup = prompts(min(args.contexts))
    for cache_name in caches:
        say(f"warm-up: {cache_name} at {min(args.contexts)}")
        measure(cache_name, warmup)

    for context in args.contexts:
        prompt = prompts(context)
        for round_ in range(args.rounds):
            fp16 = None
            for cache_name in caches:
                run = {"context": context, "round": round_, "cache": cache_name}
                run.update(measure(cache_name, prompt))
                if fp16 is None:
                    fp16 = run
                else:
                    add_ratios(run, fp16)
                say(
                    f"{context} round {round_ + 1}/{args.rounds} {cache_name}: prefill "
                    f"{run['prefill_tps']:.1f} tok/s, decode {run['decode_tps']:.2f} "
                    f"tok/s, KV {run['kv_bytes'] / MIB:.1f} MiB"
                )
                results["runs"].append(run)
                results["medians"] = medians(results["runs"], caches)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1) + "\n")

    what = (
        f"batch of {args.batch} ({'ragged' if args.ragged else 'equal'} prompts)"
        if args.batch > 1
        else "one sequence"
    )
    print(
        f"{args.shape} ({config['num_hidden_layers']} layers, {args.dtype}), {what}, "
        f"{args.decode_tokens} decode tokens, prefill step {args.prefill_step_size}; "
        f"{device}; mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}, commit "
        f"{results['commit']}; medians over {args.rounds} round(s)"
        + "".join(f"; {k}={v}" for k, v in sorted(results["environment"].items()))
    )
    print(table(results["medians"], args.batch))
    print(
        "x: the ratio to fp16's run of the same round (prefill and decode: speed, "
        "above 1 faster; KV and peak: bytes, below 1 smaller). peak: above the "
        f"weights ({weights / MIB:.1f} MiB)."
    )


if __name__ == "__main__":
    main()
