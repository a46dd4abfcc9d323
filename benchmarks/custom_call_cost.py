"""Host microseconds per custom-kernel call in a pipelined decode-like chain (MLX-CUDA):
30 chained calls of a kernel with an empty body a step, built and queued as mlx_lm
decodes (``decode_attention.pipelined_seconds``), for calls shaped like the default
turbo4 decode launch as it was at b4a5294 (12 inputs, 13 shapes and strides named, 4
outputs; since 6f6023d it has 2) and with fewer inputs, outputs or named shapes and
strides. What each costs the host, building (``cuda_kernel`` call) and queueing (MLX's
``eval_gpu``, the CUDA graph's node), decides which of them a decode launch should shed.
The variants take turns, ``--rounds`` times; medians.

    python benchmarks/custom_call_cost.py [--rounds 5] [--steps 200]
"""

import argparse
import statistics
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))
from decode_attention import pipelined_seconds  # noqa: E402

LAYERS = 30
# The default turbo4 decode launch's inputs (and below its outputs) at b4a5294 on SmolLM2 (1 sequence, 9 query / 3 KV heads,
# head_dim 64, 16 sink tokens, 15 recent): name -> (shape, dtype, shapes/strides named).
INPUTS = {
    "q": ((1, 9, 1, 64), mx.float16, ("strides",)),
    "consts": ((400,), mx.float32, ()),
    "rows": ((1, 3, 8192, 17), mx.uint32, ("shape", "strides")),
    "sink_keys": ((1, 3, 16, 64), mx.float16, ("strides",)),
    "sink_values": ((1, 3, 16, 64), mx.float16, ("strides",)),
    "sink_pos": ((1, 1, 16), mx.int32, ("shape", "strides")),
    "tail_keys": ((1, 3, 1, 64), mx.float16, ("shape", "strides")),
    "tail_values": ((1, 3, 1, 64), mx.float16, ("strides",)),
    "counters": ((3,), mx.uint32, ()),
    "previous": ((1, 9, 1, 64), mx.float16, ()),
    "kmean": ((1, 3, 1, 64), mx.float32, ("strides",)),
    "recent": ((1, 3, 15, 256), mx.float16, ("shape", "strides")),
}
OUTPUTS = {
    "out": ((1, 9, 1, 64), mx.float16),
    "work": ((3 * 64 * 3 * 66,), mx.float32),
    "new_rows": ((1, 3, 1, 17), mx.uint32),
    "next_recent": ((1, 3, 15, 256), mx.float16),
}


def variant(inputs, outputs, named=True):
    """(label, step builder) for a kernel of these inputs and outputs (names)."""
    arrays = {n: mx.zeros(INPUTS[n][0], INPUTS[n][1]) for n in inputs}
    mx.eval(list(arrays.values()))
    names = [
        f"{n}_{what}" for n in inputs if named for what in INPUTS[n][2]
    ]  # MLX passes an input's shape or strides where the source names them
    kernel = mx.fast.cuda_kernel(
        name=f"empty_{len(inputs)}_{len(outputs)}_{int(named)}",
        input_names=list(inputs),
        output_names=list(outputs),
        source="// " + " ".join(names) + "\n"
        "if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = q[0];\n",
        ensure_row_contiguous=False,
    )
    shapes = [OUTPUTS[n][0] for n in outputs]
    dtypes = [OUTPUTS[n][1] for n in outputs]

    def step(q):
        for _ in range(LAYERS):
            ins = [q if n in ("q", "previous") else arrays[n] for n in inputs]
            q = kernel(
                inputs=ins,
                template=[("T", mx.float16)],
                grid=(32, 1, 1),
                threadgroup=(32, 1, 1),
                output_shapes=shapes,
                output_dtypes=dtypes,
            )[0]
        return q

    label = f"{len(inputs)} inputs, {len(outputs)} outputs, " + (
        f"{len(names)} shapes/strides named" if named else "none named"
    )
    return label, step


def attention_variant():
    """MLX's own attention op in the same chain, for scale (fp16's decode layer)."""
    keys = mx.zeros((1, 3, 8192, 64), mx.float16)
    mx.eval(keys)

    def step(q):
        for _ in range(LAYERS):
            q = mx.fast.scaled_dot_product_attention(q, keys, keys, scale=0.125)
        return q

    return "mx.fast.scaled_dot_product_attention (8K tokens)", step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    every, outs = list(INPUTS), list(OUTPUTS)
    fewer = [n for n in every if n not in ("kmean", "sink_pos", "sink_values")]
    variants = [
        variant(every, outs),
        variant(every, outs[:1] + outs[2:]),
        variant(every, outs[:1]),
        variant(fewer, outs),
        variant(every, outs, named=False),
        variant(["q", "previous"], outs[:1], named=False),
        attention_variant(),
    ]
    q = mx.zeros(INPUTS["q"][0], mx.float16)
    mx.eval(q)
    results = {label: [] for label, _ in variants}
    for _ in range(args.rounds):
        for label, step in variants:
            parts = {}
            pipelined_seconds(step, [q] * 20)  # warm up: compile, allocator
            total = pipelined_seconds(step, [q] * args.steps, parts)
            results[label].append(
                (parts["build"], parts["queue"], parts["wait"], total)
            )
    print(f"{mx.default_device()}, MLX {mx.__version__}; us per call, medians of")
    print(f"{args.rounds} rounds of {args.steps} steps of {LAYERS} chained calls\n")
    print("| call | build | queue | wait | step / call |")
    print("|---|---:|---:|---:|---:|")
    for label, runs in results.items():
        cells = [statistics.median(r[k] for r in runs) * 1e6 / LAYERS for k in range(4)]
        print(f"| {label} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
