"""GPU time of each kernel in a chained 8-layer decode step (32 query / 8 KV heads,
head_dim 128 unless ``--heads`` says otherwise), measured by Nsight Compute (``ncu``,
on the PATH), averaged per kernel over the launches of a few steps after the caches
are filled. ncu serialises the launches and fixes the clocks, so compare kernels
within one table.

    python benchmarks/kernel_times.py --caches fp16 turbo4 --contexts 4096 131072
        [--heads 9 3 64]  # query heads, KV heads, head dim (SmolLM2's)
        [--warps-per-sm 20 --stage-buffers 1]  # the decode kernel's launch shape
        [--max-slices 64]  # the most slices a KV head's cache is cut into
        [--target-blocks 1024]  # the blocks a launch aims at (slices x groups)
        [--value-mma-max-dim 128]  # values on the tensor cores up to this head dim
"""

import argparse
import csv
import io
import subprocess
import sys
from collections import defaultdict

STEPS, MEASURED_STEPS = 30, 3


def decode(
    name,
    context,
    q_heads,
    kv_heads,
    head_dim,
    warps_per_sm,
    stage_buffers,
    max_slices,
    target_blocks,
    value_mma_max_dim,
):
    """The measured process: fill 8 layers' caches, then run decode steps."""
    import mlx.core as mx
    from decode_attention import chained_step  # benchmarks/decode_attention.py
    from mlx_lm.models.cache import KVCache

    from mlx_lm_turbo import TurboQuantKVCache
    from mlx_lm_turbo.cache.attention import install_attention_dispatch
    from mlx_lm_turbo.kernels import decode_attention

    if warps_per_sm:  # else the package's
        decode_attention.WARPS_PER_SM = warps_per_sm
    decode_attention.STAGE_BUFFERS = stage_buffers
    if max_slices:
        decode_attention.MAX_SLICES = max_slices
    if target_blocks:
        decode_attention.TARGET_BLOCKS = target_blocks
    if value_mma_max_dim:
        decode_attention.VALUE_MMA_MAX_DIM = value_mma_max_dim
    install_attention_dispatch()
    make = KVCache if name == "fp16" else (lambda: TurboQuantKVCache(name))
    caches = [make() for _ in range(8)]
    kv = mx.random.normal((1, kv_heads, context, head_dim)).astype(mx.float16)
    for c in caches:
        c.update_and_fetch(kv, kv)
        mx.eval([a for a in c.state if isinstance(a, mx.array)])
    token = mx.random.normal((1, kv_heads, 1, head_dim)).astype(mx.float16)
    query = mx.random.normal((1, q_heads, 1, head_dim)).astype(mx.float16)
    mx.eval(token, query)
    for _ in range(STEPS):
        mx.eval(chained_step(caches, query, token, head_dim))


def measure(name, context, heads, shape):
    # launches per step: fp16 two cache copies, attention and cuDNN's reduction per
    # layer; turbo one, the decode kernel (it encodes the token and writes its row in
    # place), counted among the decode kernels' launches alone (filling the caches
    # launches many others, which fp16's fill does not)
    per_step = 8 * (4 if name == "fp16" else 1)
    only = [] if name == "fp16" else ["--kernel-name", "regex:turbo_decode"]
    command = [
        "ncu",
        *only,
        "--metrics",
        "gpu__time_duration.sum",
        "--csv",
        "--launch-skip",
        str((STEPS - MEASURED_STEPS) * per_step),
        "--launch-count",
        str(MEASURED_STEPS * per_step),
        sys.executable,
        __file__,
        "--run",
        name,
        str(context),
        *map(str, heads),
        *map(str, shape),
    ]
    text = subprocess.run(command, capture_output=True, text=True).stdout
    rows = [r for r in csv.reader(io.StringIO(text)) if len(r) > 5]
    if not rows:
        raise SystemExit(f"ncu gave no measurements for {name} at {context}")
    head = rows[0]
    name_at, value_at = head.index("Kernel Name"), head.index("Metric Value")
    total, count = defaultdict(float), defaultdict(int)
    for r in rows[1:]:
        kernel = r[name_at].split("(")[0][:60]
        total[kernel] += float(r[value_at].replace(",", ""))
        count[kernel] += 1
    return [(k, count[k] / MEASURED_STEPS, total[k] / count[k] / 1e3) for k in total]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--caches", nargs="+", default=["fp16", "turbo4"])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 131072])
    parser.add_argument(
        "--heads",
        type=int,
        nargs=3,
        default=[32, 8, 128],
        metavar=("Q", "KV", "D"),
        help="query heads, KV heads, head dim",
    )
    parser.add_argument(
        "--warps-per-sm",
        type=int,
        default=0,
        help="the decode kernel's launch bounds (decode_attention.WARPS_PER_SM; "
        "0: the package's)",
    )
    parser.add_argument(
        "--stage-buffers",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="its staging buffers a warp (decode_attention.STAGE_BUFFERS; 0: its choice)",
    )
    parser.add_argument(
        "--max-slices",
        type=int,
        default=0,
        help="the most slices (decode_attention.MAX_SLICES, at most its own; 0: that)",
    )
    parser.add_argument(
        "--target-blocks",
        type=int,
        default=0,
        help="the blocks a launch aims at, slices times groups "
        "(decode_attention.TARGET_BLOCKS; 0: the package's)",
    )
    parser.add_argument(
        "--value-mma-max-dim",
        type=int,
        choices=(0, 64, 128, 256),
        default=0,
        help="the largest head dim whose values are summed on the tensor cores "
        "(decode_attention.VALUE_MMA_MAX_DIM; 0: the package's)",
    )
    parser.add_argument("--run", nargs=10, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return decode(args.run[0], *map(int, args.run[1:]))
    from mlx_lm_turbo.kernels.decode_attention import MAX_SLICES

    if not 0 <= args.max_slices <= MAX_SLICES:
        # the merging block's staging memory holds a weight per part up to that
        parser.error(f"--max-slices: at most {MAX_SLICES} (this package's), or 0")
    if args.target_blocks < 0:
        parser.error("--target-blocks: a count of blocks, or 0 for the package's")
    shape = (
        args.warps_per_sm,
        args.stage_buffers,
        args.max_slices,
        args.target_blocks,
        args.value_mma_max_dim,
    )
    print("| cache | context | kernel | launches per step | us per launch |")
    print("|---|---:|---|---:|---:|")
    for context in args.contexts:
        for name in args.caches:
            for kernel, per_step, micros in sorted(
                measure(name, context, args.heads, shape),
                key=lambda row: -row[1] * row[2],
            ):
                print(
                    f"| {name} | {context} | {kernel} | {per_step:.0f} | {micros:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
