"""The portable path's dequantization (codec.dequantize_rotated: packed codes and norms
to values in the rotated domain) against the per-code table lookup it replaced, side by
side: ms per call for one layer's keys at each length, the rounds taking turns.

    python benchmarks/dequantize.py [--tokens 512 2048 8192] [--bits 2 4 8]
        [--heads 3] [--head-dim 64] [--dtype float32]
"""

import argparse
import statistics
import time

import mlx.core as mx

from mlx_lm_turbo.codec.codebooks import codebook
from mlx_lm_turbo.codec.codec import dequantize_rotated
from mlx_lm_turbo.codec.packing import pack, unpack


def per_code(bits, head_dim, dtype):
    """The lookup before byte tables: one gather a code, compiled shapeless."""
    levels = codebook(head_dim, bits).astype(dtype)

    def dequantize(codes, norms):
        return levels[unpack(codes, bits, head_dim)] * norms.astype(dtype)

    return mx.compile(dequantize, shapeless=True)


def ms_per_call(fn, calls):
    mx.eval(fn())
    start = time.perf_counter()
    for _ in range(calls):
        mx.eval(fn())
    return (time.perf_counter() - start) / calls * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--bits", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument(
        "--dtype", choices=("float16", "bfloat16", "float32"), default="float32"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    dtype = getattr(mx, args.dtype)
    print(
        f"{mx.default_device()}, mlx {mx.__version__}, {args.heads} heads, "
        f"head_dim {args.head_dim}, {args.dtype}; medians of {args.rounds} rounds"
    )
    print("| bits | tokens | per code ms | byte table ms | speed-up |")
    print("|---:|---:|---:|---:|---:|")
    for bits in args.bits:
        before = per_code(bits, args.head_dim, dtype)
        for tokens in args.tokens:
            shape = (1, args.heads, tokens)
            codes = pack(
                mx.random.randint(0, 2**bits, (*shape, args.head_dim)).astype(
                    mx.uint32
                ),
                bits,
            )
            norms = mx.random.uniform(0.5, 2.0, (*shape, 1)).astype(mx.float16)
            mx.eval(codes, norms)
            now = dequantize_rotated(codes, norms, bits, args.head_dim, dtype)
            if not mx.array_equal(now, before(codes, norms)).item():
                raise SystemExit(f"{bits}-bit values differ at {tokens} tokens")
            old, new = [], []
            for _ in range(args.rounds):
                old.append(ms_per_call(lambda: before(codes, norms), args.calls))
                new.append(
                    ms_per_call(
                        lambda: dequantize_rotated(
                            codes, norms, bits, args.head_dim, dtype
                        ),
                        args.calls,
                    )
                )
            old_ms, new_ms = statistics.median(old), statistics.median(new)
            print(
                f"| {bits} | {tokens} | {old_ms:.3f} | {new_ms:.3f} | "
                f"{old_ms / new_ms:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
