"""The fused decode kernel's slicing, measured: ms per 8-layer decode step for each
target block count (decode_attention.TARGET_BLOCKS), fp16 in the same run.

    python benchmarks/decode_kernel_sweep.py [--contexts 32768 131072] [--targets 512 1024 4096]
"""

import argparse
import sys
from pathlib import Path

from mlx_lm.models.cache import KVCache

sys.path.insert(0, str(Path(__file__).parent))
from decode_attention import decode_steps, filled_caches  # noqa: E402

from mlx_lm_turbo import TurboQuantKVCache  # noqa: E402
from mlx_lm_turbo.integration import install_attention_dispatch  # noqa: E402
from mlx_lm_turbo.kernels import decode_attention  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument("--targets", type=int, nargs="+", default=[512, 1024, 4096])
    parser.add_argument("--scheme", default="turbo4")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    install_attention_dispatch()
    shape = dict(q_heads=32, kv_heads=8, head_dim=128)
    print("| context | cache | target blocks | ms/step | speed vs fp16 |")
    print("|---:|---|---:|---:|---:|")
    for context in args.contexts:
        caches = filled_caches(KVCache, 8, context, shape["kv_heads"], shape["head_dim"])
        fp16, _ = decode_steps(caches, args.steps, **shape)
        print(f"| {context} | fp16 | - | {fp16 * 1e3:.2f} | 1.00x |", flush=True)
        del caches
        for target in args.targets:
            decode_attention.TARGET_BLOCKS = target
            caches = filled_caches(lambda: TurboQuantKVCache(args.scheme), 8, context,
                                   shape["kv_heads"], shape["head_dim"])
            seconds, _ = decode_steps(caches, args.steps, **shape)
            print(f"| {context} | {args.scheme} | {target} | {seconds * 1e3:.2f} | "
                  f"{fp16 / seconds:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
