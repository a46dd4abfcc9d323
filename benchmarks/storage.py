"""Bytes a 4096-token cache really holds, per scheme, against fp16 (measured ``nbytes``).

python benchmarks/storage.py [--tokens 4096] [--head-dims 64 128]
"""

import argparse

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlx_lm_turbo import TurboQuantKVCache

SCHEMES = ("turbo8", "turbo4", "turbo3", "turbo2", "turbo4v2", "turbo8v4", "turbo0v4")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--kv-heads", type=int, default=8)
    args = parser.parse_args()
    print("| scheme | head_dim | bits/value | nbytes vs fp16 |")
    print("|---|---:|---:|---:|")
    for head_dim in args.head_dims:
        shape = (1, args.kv_heads, args.tokens, head_dim)
        keys = mx.random.normal(shape).astype(mx.float16)
        values = mx.random.normal(shape).astype(mx.float16)
        fp16 = KVCache()
        fp16.update_and_fetch(keys, values)
        for scheme in SCHEMES:
            cache = TurboQuantKVCache(scheme)
            cache.update_and_fetch(keys, values)
            mx.eval(cache.stored)
            bits = sum(a.nbytes for a in cache.stored) * 8 / (2 * keys.size)
            print(
                f"| {scheme} | {head_dim} | {bits:.3f} | {cache.nbytes / fp16.nbytes:.3f}x |"
            )


if __name__ == "__main__":
    main()
