"""The fused decode kernel's launch shape, measured on 8 chained layers (32 query /
8 KV heads, head_dim 128): for each warps-per-block, target block count, warps an SM
should hold (the launch bounds, which cap the registers: 16 warps, 128 registers; 20,
96; 24, 80) and staging buffers a warp holds (0: the kernel's choice, two where they
fit; a block of two takes 45 KiB of shared memory at turbo4, so at most five fit an SM
whatever the bounds; with one, 28 KiB), ms per full decode step (cache update +
attention) and ms of attention alone (the same 8 layers attending to fixed caches),
fp16 in the same run.

    python benchmarks/decode_kernel_sweep.py [--contexts 32768 131072]
        [--warps 4 8] [--targets 512 1024 4096] [--warps-per-sm 16 20 24]
        [--stage-buffers 0 1]
"""

import argparse
import itertools
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache

sys.path.insert(0, str(Path(__file__).parent))
from decode_attention import decode_steps, filled_caches  # noqa: E402

from mlx_lm_turbo import TurboQuantKVCache  # noqa: E402
from mlx_lm_turbo.cache.attention import (  # noqa: E402
    install_attention_dispatch,
    turbo_scaled_dot_product_attention,
)
from mlx_lm_turbo.kernels import decode_attention  # noqa: E402

SHAPE = dict(q_heads=32, kv_heads=8, head_dim=128)


def attention_alone(caches, steps, turbo):
    """Seconds per step of 8 chained layers attending to caches that do not grow."""
    token = mx.random.normal((1, SHAPE["kv_heads"], 1, SHAPE["head_dim"])).astype(
        mx.float16
    )
    query = mx.random.normal((1, SHAPE["q_heads"], 1, SHAPE["head_dim"])).astype(
        mx.float16
    )
    fixed = [c.update_and_fetch(token, token) for c in caches]
    scale = SHAPE["head_dim"] ** -0.5

    def step():
        x = query
        for keys, values in fixed:
            if turbo:
                x = turbo_scaled_dot_product_attention(x, keys, scale, None)
            else:
                x = mx.fast.scaled_dot_product_attention(x, keys, values, scale=scale)
        mx.eval(x)

    # Two untimed steps: the first encodes each view's token in its launch, later ones
    # attend to it as stored, through another kernel variant and its first compile.
    step()
    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--targets", type=int, nargs="+", default=[512, 1024, 4096])
    parser.add_argument(
        "--warps-per-sm", type=int, nargs="+", default=[decode_attention.WARPS_PER_SM]
    )
    parser.add_argument(
        "--stage-buffers", type=int, nargs="+", choices=(0, 1, 2), default=[0]
    )
    parser.add_argument("--scheme", default="turbo4")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    install_attention_dispatch()
    print(f"{mx.default_device()}, 8 layers, {SHAPE}")
    print(
        "| context | cache | warps | target blocks | warps per SM | stage buffers "
        "| step ms | vs fp16 | attention ms | vs fp16 |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    make_turbo = lambda: TurboQuantKVCache(args.scheme)  # noqa: E731

    def fill(make):
        return filled_caches(make, 8, context, SHAPE["kv_heads"], SHAPE["head_dim"])  # noqa: E731

    for context in args.contexts:
        fp16_step, *_ = decode_steps(fill(KVCache), args.steps, **SHAPE)
        fp16_attention = attention_alone(fill(KVCache), args.steps, turbo=False)
        print(
            f"| {context} | fp16 | - | - | - | - | {fp16_step * 1e3:.2f} | 1.00x | "
            f"{fp16_attention * 1e3:.2f} | 1.00x |",
            flush=True,
        )
        for warps, target, per_sm, buffers in itertools.product(
            args.warps, args.targets, args.warps_per_sm, args.stage_buffers
        ):
            decode_attention.WARPS, decode_attention.TARGET_BLOCKS = warps, target
            decode_attention.MIN_SLICE_TOKENS = 32 * warps
            header = (decode_attention.WARPS_PER_SM, decode_attention.STAGE_BUFFERS)
            if (per_sm, buffers) != header:
                # both are in the kernels' header: build them again
                decode_attention.WARPS_PER_SM = per_sm
                decode_attention.STAGE_BUFFERS = buffers
                decode_attention.forget_kernels()
            step, *_ = decode_steps(fill(make_turbo), args.steps, **SHAPE)
            attention = attention_alone(fill(make_turbo), args.steps, turbo=True)
            print(
                f"| {context} | {args.scheme} | {warps} | {target} | {per_sm} | "
                f"{buffers} | "
                f"{step * 1e3:.2f} | {fp16_step / step:.2f}x | {attention * 1e3:.2f} | "
                f"{fp16_attention / attention:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
