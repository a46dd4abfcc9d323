"""Decode-step attention over a stack of layers: fp16 cache vs the portable turbo path.

Each step appends one token to every layer's cache and attends through mlx-lm's
``scaled_dot_product_attention`` (the turbo path dequantizes the compressed K/V
in the rotated domain), each layer's output the next one's query; the stack is
evaluated together, as a model's decode step is, so launch overhead does not
dominate. Prints time per step, its ratio to fp16
and peak memory above the caches, side by side in one run.

    python benchmarks/decode_attention.py [--contexts 1024 4096] [--layers 8]
        [--schemes turbo4 turbo3 turbo4v2 turbo4:off] [--steps 8]

A scheme written ``NAME:MODE`` runs with MLX_LM_TURBO_KERNEL=MODE (``turbo4:off``:
the portable path where the fused kernel would run).
"""

import argparse
import os
import time

import mlx.core as mx
import mlx_lm.models.base as mlx_base
from mlx_lm.models.cache import KVCache

from mlx_lm_turbo import TurboQuantKVCache
from mlx_lm_turbo.integration import install_attention_dispatch
from mlx_lm_turbo.kernels import KERNEL_ENV


def filled_caches(make, layers, context, kv_heads, head_dim):
    caches = [make() for _ in range(layers)]
    for c in caches:
        kv = mx.random.normal((1, kv_heads, context, head_dim)).astype(mx.float16)
        c.update_and_fetch(kv, kv)
        mx.eval([a for a in c.state if isinstance(a, mx.array)])
    return caches


def decode_steps(caches, steps, q_heads, kv_heads, head_dim):
    """Seconds per step and peak memory (bytes) above what the caches held before."""
    tokens = [mx.random.normal((1, kv_heads, 1, head_dim)).astype(mx.float16) for _ in range(steps + 1)]
    query = mx.random.normal((1, q_heads, 1, head_dim)).astype(mx.float16)
    mx.eval(tokens, query)

    def step(token):
        x = query
        for c in caches:  # chained, as a model's layers are: one layer's K/V in flight at a time
            x = mlx_base.scaled_dot_product_attention(x, *c.update_and_fetch(token, token), cache=c,
                                                      scale=head_dim**-0.5, mask=None)
        mx.eval(x)

    step(tokens[0])  # warm-up: compile at this shape
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    start = time.perf_counter()
    for token in tokens[1:]:
        step(token)
    return (time.perf_counter() - start) / steps, mx.get_peak_memory() - before


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--schemes", nargs="+", default=["turbo4", "turbo3", "turbo4v2"])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    install_attention_dispatch()
    print(f"{mx.default_device()}, {args.layers} layers, {args.q_heads} query / {args.kv_heads} KV heads, "
          f"head_dim {args.head_dim}, {args.steps} steps")
    print("| cache | context | ms/step | speed vs fp16 | peak MiB above caches |")
    print("|---|---:|---:|---:|---:|")
    for context in args.contexts:
        fp16_seconds = None
        for name in ["fp16", *args.schemes]:
            scheme, _, mode = name.partition(":")
            os.environ[KERNEL_ENV] = mode or "auto"
            make = KVCache if name == "fp16" else (lambda: TurboQuantKVCache(scheme))
            caches = filled_caches(make, args.layers, context, args.kv_heads, args.head_dim)
            seconds, peak = decode_steps(caches, args.steps, args.q_heads, args.kv_heads, args.head_dim)
            fp16_seconds = fp16_seconds or seconds
            print(f"| {name} | {context} | {seconds * 1e3:.2f} | {fp16_seconds / seconds:.2f}x | "
                  f"{peak / 2**20:.1f} |", flush=True)
            del caches


if __name__ == "__main__":
    main()
