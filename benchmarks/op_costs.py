"""What one op of a chained decode step costs on this backend, by kind of op.

A chain of ``--depth`` ops of one kind (each op's output the next one's input, as a
model's layers are) is built and evaluated ``--steps`` times three ways: built only
(the host's Python and graph construction), built and evaluated one chain at a time
(host scheduling and GPU work in series), and pipelined (the next chain built and
queued while this one runs; its host time split into building and queueing, MLX's own
work per op in ``mx.async_eval``). The table gives microseconds per op: what a decode
step pays for each op of that kind, and how it grows with a custom kernel's inputs,
outputs, template values and named strides. Shapes are SmolLM2-135M's decode (9 query / 3 KV heads,
head_dim 64, fp16); the attention ops read ``--context`` cached tokens.

    python benchmarks/op_costs.py [--depth 30] [--steps 50] [--context 8192]
"""

import argparse
import sys
import time
from pathlib import Path

import mlx.core as mx

from mlx_lm_turbo import TurboQuantKVCache
from mlx_lm_turbo.cache.attention import install_attention_dispatch
from mlx_lm_turbo.kernels import decode_attention, encode
from mlx_lm_turbo.kernels.dispatch import gpu_backend

sys.path.insert(0, str(Path(__file__).parent))
from decode_attention import pipelined_seconds  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def chain_costs(op, x0, depth, steps):
    """(build, one step, pipelined, pipelined's queueing) microseconds per op of a
    chain of ``op``."""

    def build():
        x = x0
        for _ in range(depth):
            x = op(x)
        return x

    mx.eval(build())  # compile and allocate once
    start = time.perf_counter()
    built = [build() for _ in range(steps)]
    build_time = time.perf_counter() - start
    mx.eval(built)
    del built
    start = time.perf_counter()
    for _ in range(steps):
        mx.eval(build())
    one_step = time.perf_counter() - start
    parts = {}
    pipelined = pipelined_seconds(lambda _: build(), range(steps), parts) * steps
    per_op = 1e6 / (steps * depth)
    return (
        build_time * per_op,
        one_step * per_op,
        pipelined * per_op,
        parts["queue"] * steps * per_op,
    )


def copy_kernel(n_inputs, n_template, strides, n_outputs=1):
    """A custom kernel copying its first input, with placeholder inputs, outputs and
    template values beside it (the host's cost per call grows with them)."""
    names = ["x"] + [f"extra{i}" for i in range(n_inputs - 1)]
    # Naming an input's strides in the source makes MLX pass them.
    use = "".join(f"(void){n}_strides;" for n in names) if strides else ""
    kernel = mx.fast.cuda_kernel(
        name=f"copy_{n_inputs}_{n_template}_{int(strides)}_{n_outputs}",
        input_names=names,
        output_names=["out"] + [f"more{i}" for i in range(n_outputs - 1)],
        source=use + "int i = blockIdx.x * blockDim.x + threadIdx.x;"
        "if (i < x_shape[0] * x_shape[1] * x_shape[2] * x_shape[3]) out[i] = x[i];",
        ensure_row_contiguous=False,
    )
    extras = [mx.zeros((1,), mx.float32) for _ in range(n_inputs - 1)]
    template = [("T", mx.float16)] + [(f"V{i}", i) for i in range(n_template - 1)]
    mx.eval(extras)

    def op(x):
        return kernel(
            inputs=[x, *extras],
            template=template,
            grid=(x.size, 1, 1),
            threadgroup=(min(x.size, 256), 1, 1),
            output_shapes=[x.shape] + [(1,)] * (n_outputs - 1),
            output_dtypes=[x.dtype] + [mx.float32] * (n_outputs - 1),
        )[0]

    return op


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--context", type=int, default=8192)
    args = parser.parse_args()
    install_attention_dispatch()
    query = mx.random.normal((1, Q_HEADS, 1, HEAD_DIM)).astype(mx.float16)
    history = mx.random.normal((1, KV_HEADS, args.context, HEAD_DIM)).astype(mx.float16)
    token = history[:, :, :1]
    cache, other = TurboQuantKVCache("turbo4"), TurboQuantKVCache("turbo4")
    for c in (cache, other):
        c.update_and_fetch(history, history)
    view, _ = cache.update_and_fetch(token, token)
    cache.settle()  # a plain view: its token encoded, exact copies made
    step, _ = other.update_and_fetch(token, token)  # on MLX-CUDA its token is unencoded
    mx.eval(query, history, token, view.stored, view.new_keys, view.new_values)
    scale = HEAD_DIM**-0.5
    ops = {
        "x + 1": (lambda x: x + 1, query),
        "mx.fast.scaled_dot_product_attention": (
            lambda x: mx.fast.scaled_dot_product_attention(
                x, history, history, scale=scale
            ),
            query,
        ),
    }
    if gpu_backend() == "cuda":
        for n_inputs, n_template, strides, n_outputs in (
            (1, 1, False, 1),
            (7, 1, False, 1),
            (14, 1, False, 1),
            (14, 5, False, 1),
            (14, 5, True, 1),
            (1, 1, False, 4),
            (14, 5, True, 4),
        ):
            ops[
                f"custom kernel: {n_inputs} inputs, {n_outputs} outputs, "
                f"{n_template} template values" + (", strides" if strides else "")
            ] = (copy_kernel(n_inputs, n_template, strides, n_outputs), query)
        ops["fused decode attention (turbo4)"] = (
            lambda x: decode_attention.fused_decode_attention(x, view, scale, None),
            query,
        )
        if step.pending is not None:
            ops["fused decode attention, encoding the token (turbo4)"] = (
                lambda x: decode_attention.fused_decode_and_encode(
                    x, step, scale, None
                )[0],
                query,
            )
        ops["fused encode (turbo4)"] = (
            lambda x: encode.fused_encode(view.codec, x, x)[1],
            token,
        )
    print(
        f"{mx.default_device()}, MLX {mx.__version__}, chains of {args.depth} ops, "
        f"{args.steps} steps, {args.context} cached tokens\n"
    )
    print(
        "| op | build us/op | one step us/op | pipelined us/op "
        "| pipelined: queue us/op |"
    )
    print("|---|---:|---:|---:|---:|")
    for label, (op, x0) in ops.items():
        costs = chain_costs(op, x0, args.depth, args.steps)
        print(
            f"| {label} | " + " | ".join(f"{c:.1f}" for c in costs) + " |", flush=True
        )


if __name__ == "__main__":
    main()
