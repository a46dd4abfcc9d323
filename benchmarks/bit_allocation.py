"""Per-layer bit allocation against plain schemes and mlx-lm's affine 4-bit, end to end.

Calibrates every layer's sensitivity on one slice of Pride and Prejudice
(``mlx_lm_turbo.tools.allocate``), allocates widths for each budget (bits per value
all-in: codes, norms, exact sink tokens at the evaluated context), then compares on
another slice, as benchmarks/key_calibration.py does: ``--prefill`` tokens in one
chunk, ``--decode`` teacher-forced steps, KL of next-token distributions against an
fp16 cache. Every row's bits per value is counted from the cache it ran with.

    python benchmarks/bit_allocation.py [--model gemma3] [--prefill 1024] [--decode 64]
        [--budgets 3.5 4.5] [--schemes turbo3 turbo4v2 turbo4] [--json OUT]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

from mlx_lm_turbo import make_prompt_cache
from mlx_lm_turbo.tools.allocate import (
    all_in_bits,
    allocate,
    layer_sensitivities,
    layer_shapes,
)
from mlx_lm_turbo.tools.bench import BOOK
from mlx_lm_turbo.tools.gguf import resolve_model
from mlx_lm_turbo.tools.quality import (
    affine_after_prefill,
    compare,
    teacher_forced_logprobs,
)


def say(message):
    print(f"[bit_allocation] {message}", file=sys.stderr, flush=True)


def slice_tokens(tokenizer, text, start, n):
    tokens = tokenizer.encode(text[start : start + 12 * n])
    return mx.array(tokens[:n])


def stored_bits(cache):
    """Bits per value the compressed entries hold: codes, norms, exact sink tokens."""
    bits = values = 0
    for c in cache:
        if not hasattr(c, "codec"):
            continue
        arrays = list(c._stored_slice()) + list(c.sinks or ())
        bits += 8 * sum(a.nbytes for a in arrays)
        held = c._stored_slice()[0]
        values += (
            held.shape[0]
            * held.shape[2]
            * c.codec.n_kv_heads
            * (c.codec.key_dim + c.codec.value_dim)
        )
    return bits / values


def plan_name(plan):
    counts = {}
    for s in plan.values():
        counts[s.name] = counts.get(s.name, 0) + 1
    return ", ".join(f"{n} x {name}" for name, n in sorted(counts.items()))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="gemma3, smollm2 or a model dir")
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--calibration-tokens", type=int, default=512)
    parser.add_argument("--budgets", type=float, nargs="+", default=[3.5, 4.5])
    parser.add_argument("--probe-tokens", type=int, default=64)
    parser.add_argument(
        "--no-affine", action="store_true", help="leave out the affine4 row"
    )
    parser.add_argument(
        "--plain",
        nargs="*",
        default=["turbo3:0", "turbo4v2:0", "turbo4:0", "turbo4:1", "turbo4:2"],
        help="plain schemes to compare, as SCHEME:BOUNDARY_SKIP",
    )
    parser.add_argument(
        "--sensitivities", default=None, help="reuse (or write) the calibration here"
    )
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args()

    model, tokenizer = load(resolve_model(args.model))
    text = BOOK.read_text()
    # Evaluated where the other fidelity benchmarks look; calibrated half a book later.
    tokens = slice_tokens(tokenizer, text, len(text) // 10, args.prefill + args.decode)
    targets = tokens[args.prefill :]
    calibration = slice_tokens(tokenizer, text, len(text) // 2, args.calibration_tokens)

    t0 = time.time()
    saved = Path(args.sensitivities) if args.sensitivities else None
    if saved and saved.exists():
        sens = {
            int(i): {p: {int(w): v for w, v in d.items()} for p, d in parts.items()}
            for i, parts in json.loads(saved.read_text()).items()
        }
    else:
        sens = layer_sensitivities(
            model, calibration, probe_tokens=args.probe_tokens, progress=say
        )
        if saved:
            saved.write_text(json.dumps(sens, indent=1))
    calibration_seconds = time.time() - t0
    say(f"calibration {calibration_seconds:.0f} s")

    context = args.prefill + args.decode - 1  # the tokens held at the last step
    shapes = layer_shapes(model, context)
    reference = teacher_forced_logprobs(
        model, tokens, mlx_make_prompt_cache(model), args.prefill
    )
    rows = []

    def record(name, plan, bits, logprobs, t0):
        row = {
            "cache": name,
            "plan": plan,
            "bits_per_value": bits,
            **compare(reference, logprobs, targets),
            "seconds": round(time.time() - t0, 1),
        }
        rows.append(row)
        say(json.dumps(row))
        if args.json:  # as it goes: a run stopped early keeps its rows; the last is all
            Path(args.json).write_text(
                json.dumps(
                    {
                        "args": vars(args),
                        "calibration_seconds": calibration_seconds,
                        "sensitivities": sens,
                        "rows": rows,
                    },
                    indent=1,
                )
            )

    if not args.no_affine:
        t0 = time.time()
        record(
            "affine4 (g64)",
            "-",
            4.5,
            teacher_forced_logprobs(
                model,
                tokens,
                mlx_make_prompt_cache(model),
                args.prefill,
                affine_after_prefill(4),
            ),
            t0,
        )

    def run(name, scheme, plan_text, **options):
        t0 = time.time()
        # W 1: the plans' bits count no window (tools/allocate.py)
        cache = make_prompt_cache(model, scheme, recent_exact=1, **options)
        logprobs = teacher_forced_logprobs(model, tokens, cache, args.prefill)
        record(name, plan_text, stored_bits(cache), logprobs, t0)

    for budget in args.budgets:
        plan = allocate(shapes, sens, budget)
        say(f"budget {budget}: {plan_name(plan)} ({all_in_bits(shapes, plan):.3f})")
        run(
            f"allocated <= {budget}",
            "turbo4",
            {i: s.name for i, s in plan.items()},
            boundary_skip=0,
            layer_schemes=plan,
        )
    for plain in args.plain:
        scheme, skip = plain.split(":")
        run(f"{scheme}, boundary skip {skip}", scheme, "-", boundary_skip=int(skip))
    affine = float("nan") if args.no_affine else rows[0]["kl"]
    print(
        f"\n{args.prefill}-token prefill, {args.decode} teacher-forced decode steps; "
        f"fp16-cache perplexity {rows[0]['ppl_reference']:.2f}; calibration "
        f"{args.calibration_tokens} tokens, {calibration_seconds:.0f} s\n"
    )
    print(
        "| cache | bits/value all-in | KL vs fp16 | vs affine4 | top-1 | perplexity |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['cache']} | {r['bits_per_value']:.3f} | {r['kl']:.4f} | "
            f"{r['kl'] / affine:.2f}x | {r['top1']:.3f} | {r['ppl']:.2f} |"
        )


if __name__ == "__main__":
    main()
