"""Which key calibration to turn on by default: measured on the real model.

For each scheme and calibration (none / center / center+scale), prefill a slice of
Pride and Prejudice in one chunk, then decode the following tokens one at a time
(teacher-forced), and compare next-token distributions with an fp16 cache.
mlx-lm's affine 4-bit cache (prefilled in fp16, then quantized, as --kv-bits runs)
is the reference point.

    python benchmarks/key_calibration.py [--model DIR] [--prefill 2048] [--decode 256]
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
from mlx_lm_turbo.codec import KEY_CALIBRATIONS
from mlx_lm_turbo.bench import BOOK as TEXT
from mlx_lm_turbo.gguf import demo_model_path
from mlx_lm_turbo.quality import affine_after_prefill, compare, teacher_forced_logprobs




def affine_logprobs(model, tokens, prefill, bits):
    return teacher_forced_logprobs(model, tokens, mlx_make_prompt_cache(model), prefill, affine_after_prefill(bits))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="mlx-lm model dir (default: the demo model)")
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--decode", type=int, default=256)
    parser.add_argument("--schemes", nargs="+", default=["turbo4", "turbo3", "turbo2", "turbo4v2", "turbo8v4"])
    parser.add_argument("--boundary-skip", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args()

    model, tokenizer = load(str(args.model or demo_model_path()))
    text = TEXT.read_text()
    start = len(text) // 10  # past the front matter
    tokens = mx.array(tokenizer.encode(text[start:start + 12 * (args.prefill + args.decode)]))
    tokens = tokens[: args.prefill + args.decode]
    targets = tokens[args.prefill:]

    reference = teacher_forced_logprobs(model, tokens, mlx_make_prompt_cache(model), args.prefill)
    rows = []

    def record(name, calibration, skip, logprobs, t0):
        row = {"cache": name, "key_calibration": calibration, "boundary_skip": skip,
               **compare(reference, logprobs, targets), "seconds": round(time.time() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    t0 = time.time()
    record("affine4 (g64)", "-", "-", affine_logprobs(model, tokens, args.prefill, 4), t0)
    for scheme in args.schemes:
        for skip in args.boundary_skip:
            for calibration in KEY_CALIBRATIONS:
                t0 = time.time()
                cache = make_prompt_cache(model, scheme, boundary_skip=skip, key_calibration=calibration)
                record(scheme, calibration, skip, teacher_forced_logprobs(model, tokens, cache, args.prefill), t0)

    print(f"\n{args.prefill}-token prefill, {args.decode} teacher-forced decode steps; "
          f"fp16-cache perplexity {rows[0]['ppl_reference']:.2f}\n")
    print("| cache | key calibration | boundary skip | KL vs fp16 | top-1 | perplexity |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['cache']} | {r['key_calibration']} | {r['boundary_skip']} | {r['kl']:.4f} | "
              f"{r['top1']:.3f} | {r['ppl']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
