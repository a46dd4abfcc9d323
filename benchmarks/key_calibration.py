"""Which key calibration and how many exact sink tokens to use by default: measured
on the real model.

For each scheme, calibration (none / center / center+scale) and number of first
tokens kept exact (``TurboQuantKVCache.sink_tokens``), prefill a slice of
Pride and Prejudice in one chunk, then decode the following tokens one at a time
(teacher-forced), and compare next-token distributions with an fp16 cache.
mlx-lm's affine 4-bit cache (prefilled in fp16, then quantized, as --kv-bits runs)
is the reference point.

    python benchmarks/key_calibration.py [--model DIR] [--prefill 2048] [--decode 256]
        [--schemes turbo4 turbo3] [--calibrations center] [--sink-tokens 0 4]
        [--recent-exact 1 16 64]

``--recent-exact W`` tries a lever of issue 14: each query also reads the W - 1 tokens
before it exactly (kept in the attention domain, W - 1 tokens a layer), by a cache
that holds them here only (not saved, trimmed or batched: a measurement).
"""

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

from mlx_lm_turbo import TurboQuantKVCache, make_prompt_cache
from mlx_lm_turbo.codec.codec import KEY_CALIBRATIONS
from mlx_lm_turbo.codec.packing import packed_words
from mlx_lm_turbo.codec.schemes import parse_scheme
from mlx_lm_turbo.tools.bench import BOOK as TEXT
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


class RecentExactKVCache(TurboQuantKVCache):
    """A full-attention turbo cache whose queries also read the tokens just before
    them exactly: the exact tail handed to attention is the chunk plus the recent
    tokens before it, read within a window of ``exact_window`` keys."""

    recent = None

    def _update_compressed(self, stored, exact_keys, exact_values):
        if self.recent is not None:
            exact_keys, exact_values = (
                mx.concatenate([r, a], axis=2)
                for r, a in zip(self.recent, (exact_keys, exact_values))
            )
        keep = self.exact_window - 1
        self.recent = tuple(
            mx.contiguous(a[:, :, -keep:]) for a in (exact_keys, exact_values)
        )
        return super()._update_compressed(stored, exact_keys, exact_values)


def with_recent_exact(cache, window):
    if window > 1:
        for c in cache:
            if type(c) is TurboQuantKVCache:
                c.__class__ = RecentExactKVCache
                c.exact_window = window
    return cache


def all_in_bits(scheme, attention, tokens, sinks, recent, exact_bits=16):
    """Bits per cached value, all in, where every layer is compressed alike (boundary
    skip 0): the stored rows, and the exact tokens at ``exact_bits`` (as an fp16 model
    holds them): the sink tokens twice (as the model gave them and in the attention
    domain), the recent ones once."""
    scheme = parse_scheme(scheme)
    key_dim = attention.k_proj.weight.shape[0] // attention.n_kv_heads
    value_dim = attention.v_proj.weight.shape[0] // attention.n_kv_heads
    row_bits = 32 * (
        (packed_words(key_dim, scheme.key_bits) if scheme.key_bits else 0)
        + packed_words(value_dim, scheme.value_bits)
        + 1
    )
    if not scheme.key_bits:
        row_bits += key_dim * exact_bits
    exact = min(2 * sinks + max(recent - 1, 0), tokens)
    return (row_bits + exact * exact_bits * (key_dim + value_dim) / tokens) / (
        key_dim + value_dim
    )


def print_table(rows, prefill, decode, attention):
    tokens = prefill + decode
    print(
        f"\n{prefill}-token prefill, {decode} teacher-forced decode steps; "
        f"fp16-cache perplexity {rows[0]['ppl_reference']:.2f}; bits per value all in "
        f"at {tokens} tokens, exact tokens counted at 16 bits (boundary skip 0 only)\n"
    )
    print(
        "| cache | key calibration | boundary skip | sink tokens | recent exact "
        "| bits/value all in | KL vs fp16 | top-1 | perplexity |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        bits = "4.500" if r["cache"].startswith("affine4") else "-"
        if r["boundary_skip"] == 0:
            recent = r.get("recent_exact", TurboQuantKVCache.exact_window)
            bits = all_in_bits(r["cache"], attention, tokens, r["sink_tokens"], recent)
            bits = f"{bits:.3f}"
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
    parser.add_argument(
        "--recent-exact",
        type=int,
        nargs="+",
        default=[TurboQuantKVCache.exact_window],
        help="keys each query reads exactly, itself included (see above)",
    )
    parser.add_argument("--json", default=None, help="write the results here too")
    parser.add_argument(
        "--table-from", default=None, help="print the table of a saved --json and stop"
    )
    args = parser.parse_args()

    model, tokenizer = load(str(args.model or demo_model_path()))
    if args.table_from:
        rows = json.loads(Path(args.table_from).read_text())
        return print_table(rows, args.prefill, args.decode, model.layers[0].self_attn)
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
                        ),
                        sinks,
                    )
                    record(
                        scheme,
                        calibration,
                        skip,
                        sinks,
                        teacher_forced_logprobs(
                            model,
                            tokens,
                            with_recent_exact(cache, recent),
                            args.prefill,
                        ),
                        t0,
                        recent,
                    )

    print_table(rows, args.prefill, args.decode, model.layers[0].self_attn)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
