"""Which key calibration and how many exact sink tokens to use by default: measured
on the real model.

For each scheme, calibration (none / center / center+scale / center+query) and
number of first tokens kept exact (``TurboQuantKVCache.sink_tokens``), prefill a
slice of Pride and Prejudice in one chunk, then decode the following tokens one at a time
(teacher-forced), and compare next-token distributions with an fp16 cache.
mlx-lm's affine 4-bit cache (prefilled in fp16, then quantized, as --kv-bits runs)
is the reference point.

    python benchmarks/key_calibration.py [--model DIR] [--prefill 2048] [--decode 256]
        [--schemes turbo4 turbo3] [--calibrations center] [--sink-tokens 0 4]
        [--recent-exact 1 16 64]

``--recent-exact W`` tries a lever of issue 14: each query also reads the W - 1 tokens
before it exactly (``make_prompt_cache(..., recent_exact=W)``: the caches keep exact
copies of the last W - 1 tokens in the model's dtype, counted in the bits like the
sink tokens).

``center+query`` (the default, since it won this comparison: docs/performance.md)
scales each key channel by the sink tokens' keys and
queries (``codec.KEY_CALIBRATIONS``).
"""

import argparse
import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

from mlx_lm_turbo import (
    TurboQuantKVCache,
    make_prompt_cache,
)
from mlx_lm_turbo.codec.codec import KEY_CALIBRATIONS
from mlx_lm_turbo.codec.schemes import parse_scheme
from mlx_lm_turbo.tools.allocate import all_in_bits as allocated_bits
from mlx_lm_turbo.tools.allocate import layer_shapes
from mlx_lm_turbo.tools.bench import BOOK as TEXT
from mlx_lm_turbo.tools.bench import add_recent_exact_argument
from mlx_lm_turbo.tools.gguf import demo_model_path
from mlx_lm_turbo.tools.quality import (
    affine_after_prefill,
    compare,
    teacher_forced_logprobs,
)


def with_sink_tokens(cache, n):
    for c in cache:
        if isinstance(c, TurboQuantKVCache):  # sliding-window caches keep none
            c.sink_tokens = n
    return cache


def all_in_bits(model, tokens, scheme, recent, exact_bits=None):
    """Bits per value all in at ``tokens`` tokens, every layer at ``scheme``, counted as
    tools/allocate.py counts them (codes, norms, one exact copy of the sink and recent
    tokens in the model's dtype, or in ``exact_bits``, the sink tokens' query
    energies)."""
    shapes = [
        dataclasses.replace(
            s,
            recent_tokens=min(recent, s.tokens) - 1,
            exact_bits=exact_bits or s.exact_bits,
        )
        for s in layer_shapes(model, tokens)
    ]
    scheme = parse_scheme(scheme)
    return allocated_bits(shapes, {s.index: scheme for s in shapes})


def print_table(rows, prefill, decode, model, exact_bits=None):
    tokens = prefill + decode - 1  # the last target is predicted, never cached
    copies = f"{exact_bits}-bit" if exact_bits else "the model's dtype for"
    print(
        f"\n{prefill}-token prefill, {decode} teacher-forced decode steps; "
        f"fp16-cache perplexity {rows[0]['ppl_reference']:.2f}; bits per value all in at "
        f"{tokens} tokens (boundary skip 0; {copies} exact copies)\n"
    )
    print(
        "| cache | key calibration | boundary skip | sink tokens | recent exact "
        "| bits/value all in | KL vs fp16 | top-1 | perplexity |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        bits = "4.500" if r["cache"].startswith("affine4") else "-"
        if r["boundary_skip"] == 0:
            recent = r.get("recent_exact", 1)  # rows from before the option: none
            bits = f"{all_in_bits(model, tokens, r['cache'], recent, exact_bits):.3f}"
        print(
            f"| {r['cache']} | {r['key_calibration']} | {r['boundary_skip']} | "
            f"{r['sink_tokens']} | {r.get('recent_exact', '-')} | {bits} | {r['kl']:.4f} "
            f"| {r['top1']:.3f} | {r['ppl']:.2f} |"
        )


def affine_logprobs(model, tokens, prefill, bits):
    return teacher_forced_logprobs(
        model, tokens, mlx_make_prompt_cache(model), prefill, affine_after_prefill(bits)
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="mlx-lm model dir (default: the demo model)"
    )
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--decode", type=int, default=256)
    parser.add_argument(
        "--schemes",
        nargs="+",
        default=["turbo4", "turbo3", "turbo2", "turbo4v2", "turbo8v4"],
    )
    parser.add_argument("--boundary-skip", type=int, nargs="+", default=[0, 2])
    parser.add_argument(
        "--calibrations",
        nargs="+",
        choices=KEY_CALIBRATIONS,
        default=list(KEY_CALIBRATIONS),
    )
    parser.add_argument(
        "--sink-tokens", type=int, nargs="+", default=[TurboQuantKVCache.sink_tokens]
    )
    add_recent_exact_argument(parser)
    parser.add_argument("--json", default=None, help="write the results here too")
    parser.add_argument(
        "--table-from", default=None, help="print the table of a saved --json and stop"
    )
    parser.add_argument(
        "--exact-bits",
        type=int,
        choices=[16, 32],
        default=None,
        help="count exact copies at these bits (default: the model's dtype; 16 is what "
        "an fp16 or bf16 model holds where this CPU runs float32)",
    )
    args = parser.parse_args()

    model, tokenizer = load(str(args.model or demo_model_path()))
    if args.table_from:
        rows = json.loads(Path(args.table_from).read_text())
        return print_table(rows, args.prefill, args.decode, model, args.exact_bits)
    text = TEXT.read_text()
    start = len(text) // 10  # past the front matter
    tokens = mx.array(
        tokenizer.encode(text[start : start + 12 * (args.prefill + args.decode)])
    )
    tokens = tokens[: args.prefill + args.decode]
    targets = tokens[args.prefill :]

    reference = teacher_forced_logprobs(
        model, tokens, mlx_make_prompt_cache(model), args.prefill
    )
    rows = []

    def record(name, calibration, skip, sinks, logprobs, t0, recent="-"):
        row = {
            "cache": name,
            "key_calibration": calibration,
            "boundary_skip": skip,
            "sink_tokens": sinks,
            "recent_exact": recent,
            **compare(reference, logprobs, targets),
            "seconds": round(time.time() - t0, 1),
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if args.json:  # a long run keeps what it measured if it is cut off
            Path(args.json).write_text(json.dumps(rows, indent=1))

    t0 = time.time()
    record(
        "affine4 (g64)",
        "-",
        "-",
        "-",
        affine_logprobs(model, tokens, args.prefill, 4),
        t0,
    )
    for scheme in args.schemes:
        for skip in args.boundary_skip:
            for calibration in args.calibrations:
                for sinks, recent in itertools.product(
                    args.sink_tokens, args.recent_exact
                ):
                    t0 = time.time()
                    cache = with_sink_tokens(
                        make_prompt_cache(
                            model,
                            scheme,
                            boundary_skip=skip,
                            key_calibration=calibration,
                            recent_exact=recent,
                        ),
                        sinks,
                    )
                    logprobs = teacher_forced_logprobs(
                        model, tokens, cache, args.prefill
                    )
                    record(scheme, calibration, skip, sinks, logprobs, t0, recent)

    print_table(rows, args.prefill, args.decode, model, args.exact_bits)


if __name__ == "__main__":
    main()
