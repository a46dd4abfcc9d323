"""Where a turbo cache's decode launch spends its time, block by block (MLX-CUDA).

8 chained decode layers as decode_attention.py runs them (32 query / 8 KV heads, head_dim
128 unless ``--heads`` says otherwise), the kernel built with PHASE_TIMES: each block
records the GPU's nanosecond clock at the end of its prologue, of its tokens, of
writing its part, of merging its chunk, and at its end (decode_attention.cu). Read after
the last layer's launch of each measured step; medians over the steps, in us from the
launch's first block start:

    python benchmarks/block_phases.py --contexts 4096 131072 [--heads 9 3 64]
        [--cache turbo4] [--steps 8]

Columns: the launch's span (first block start to last block end), when the last block
started, a slice block's prologue, tokens and part (median durations), when the last
slice's part and the exact block's part were written, the chunks' merges (median
duration) and the group's merge (from the last part written to the launch's end).
The records cost the kernel a few clock reads and stores of one thread a block.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from decode_attention import chained_step, filled_caches  # noqa: E402

US = 1e-3  # the records are in ns


def launch_phases(records):
    """One launch's summary from its blocks' records (lists of PHASE_WORDS ints)."""
    starts = [r[0] | r[1] << 32 for r in records]
    first = min(starts)
    blocks = list(zip(records, starts))
    at = lambda r, s, mark: s - first + r[mark]  # noqa: E731
    slices = [(r, s) for r, s in blocks if not r[3] & 1]
    exact = [(r, s) for r, s in blocks if r[3] & 1]
    mergers = [r for r in records if r[3] & 2]
    span = max(at(r, s, 8) for r, s in blocks)
    return {
        "span": span,
        "last start": max(starts) - first,
        "prologue": statistics.median(r[4] for r, _ in slices),
        "tokens": statistics.median(r[5] - r[4] for r, _ in slices),
        "part": statistics.median(r[6] - r[5] for r, _ in slices),
        "last slice part": max(at(r, s, 6) for r, s in slices),
        "exact part": max((at(r, s, 6) for r, s in exact), default=0),
        "chunk merge": statistics.median(r[7] - r[6] for r in mergers)
        if mergers
        else 0,
        "group merge": span - max(at(r, s, 6) for r, s in blocks),
    }


def record_grids(decode_attention):
    """Build the kernels with the records, and keep each launch's grid."""
    decode_attention.PHASE_TIMES = True
    launch, grids = decode_attention._Plan.launch, []

    def recorded(plan, n_tokens):
        settings = launch(plan, n_tokens)
        grids.append(settings["grid"])
        return settings

    decode_attention._Plan.launch = recorded
    return grids


def measure(grids, cache_name, context, q_heads, kv_heads, head_dim, steps):
    import mlx.core as mx

    from mlx_lm_turbo import TurboQuantKVCache
    from mlx_lm_turbo.attach.attention import install_attention_dispatch
    from mlx_lm_turbo.kernels import decode_attention

    install_attention_dispatch()
    caches = filled_caches(
        lambda: TurboQuantKVCache(cache_name), 8, context, kv_heads, head_dim
    )
    token = mx.random.normal((1, kv_heads, 1, head_dim)).astype(mx.float16)
    query = mx.random.normal((1, q_heads, 1, head_dim)).astype(mx.float16)
    mx.eval(token, query)
    words = decode_attention.PHASE_WORDS
    launches = []
    for step in range(4 + steps):  # 4 warm-up steps
        mx.eval(chained_step(caches, query, token, head_dim))
        if step < 4:
            continue
        n_blocks = grids[-1][0] // (32 * decode_attention.WARPS) * grids[-1][1]
        workspace = decode_attention._workspace(mx.float16).array.reshape(-1)
        records = workspace[-n_blocks * words :].reshape(n_blocks, words).tolist()
        launches.append(launch_phases(records))
    return n_blocks, {k: statistics.median(p[k] for p in launches) for k in launches[0]}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cache", default="turbo4")
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 131072])
    parser.add_argument(
        "--heads",
        type=int,
        nargs=3,
        default=[32, 8, 128],
        metavar=("Q", "KV", "D"),
        help="query heads, KV heads, head dim",
    )
    parser.add_argument("--steps", type=int, default=8, help="measured steps")
    args = parser.parse_args()
    from mlx_lm_turbo.kernels import decode_attention
    from mlx_lm_turbo.kernels.dispatch import gpu_backend

    if gpu_backend() != "cuda":
        print(
            "block_phases.py: needs MLX's CUDA backend (the records are the CUDA "
            "kernel's); run it on an NVIDIA GPU.",
            file=sys.stderr,
        )
        sys.exit(2)
    q_heads, kv_heads, head_dim = args.heads
    grids = record_grids(decode_attention)
    print(
        f"{args.cache}, {q_heads} query / {kv_heads} KV heads, head_dim {head_dim}; "
        f"us, medians of {args.steps} steps' last launches\n"
    )
    rows = []
    for context in args.contexts:
        n_blocks, phases = measure(
            grids, args.cache, context, q_heads, kv_heads, head_dim, args.steps
        )
        rows.append((context, n_blocks, phases))
    names = list(rows[0][2])
    print("| context | blocks | " + " | ".join(names) + " |")
    print("|---:|---:|" + "---:|" * len(names))
    for context, n_blocks, phases in rows:
        cells = " | ".join(f"{phases[k] * US:.2f}" for k in names)
        print(f"| {context} | {n_blocks} | {cells} |")


if __name__ == "__main__":
    main()
