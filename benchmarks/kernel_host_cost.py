"""Host time of building one fused decode-attention call (graph construction only,
nothing evaluated), against MLX's own attention op, and with the kernel source as
written (comments, indentation) instead of the stripped one ``kernels.dispatch.source``
hands MLX, and a whole decode layer (cache update + attention) against mlx-lm's
KVCache. 4K tokens of turbo4, 8 KV heads, head_dim 128. Where the time goes: the
``mx.fast.cuda_kernel`` call alone with the same arguments, and a kernel of an empty
body with as many inputs (the call passes no template values: its header declares them;
also with them, inside ``mx.compile``, and as hand-written PTX through
``mx.fast.precompiled_cuda_kernel``, which has no source to assemble per call), or with
one input and one template value.

``--stub-kernels`` runs anywhere (CPU included): ``mx.fast.cuda_kernel`` is replaced by
a stand-in returning zeroed outputs and the kernels' layer check passes, so what is
timed is the Python and the MLX graph building around the fused path, not MLX's own
cost of a custom-kernel call (the rows that measure that are left out).

    python benchmarks/kernel_host_cost.py [--stub-kernels]
"""

import argparse
import time

import mlx.core as mx
from mlx_lm.models import base as mlx_base
from mlx_lm.models.cache import KVCache

import mlx_lm_turbo.kernels.decode_attention as decode_attention
import mlx_lm_turbo.kernels.dispatch as dispatch
import mlx_lm_turbo.kernels.encode as encode
from mlx_lm_turbo import TurboQuantKVCache
from mlx_lm_turbo.cache.attention import install_attention_dispatch
from mlx_lm_turbo.kernels.dispatch import _SOURCES, source


def per_call(label, fn, calls=3000):
    """Host microseconds per call of ``fn`` (graph construction; nothing evaluated)."""
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    print(
        f"| {label} | {(time.perf_counter() - start) / calls * 1e6:.1f} |", flush=True
    )


def stub_kernels():
    """Custom kernels that return zeroed outputs, served on any backend."""

    def cuda_kernel(name, input_names, output_names, source, **options):
        def call(inputs, grid, threadgroup, output_shapes, output_dtypes, template=()):
            return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]

        return call

    mx.fast.cuda_kernel = cuda_kernel
    # as on MLX-CUDA: the kernels serve every layer, the decode launch encodes too
    dispatch._layer_support = lambda *where_and_what: None
    decode_attention.gpu_backend = encode.gpu_backend = lambda: "cuda"


def empty_ptx(name, n_params):
    """PTX of a kernel that takes n_params pointers and does nothing (for
    ``mx.fast.precompiled_cuda_kernel``, which loads PTX or a cubin as it is)."""
    params = ", ".join(f".param .u64 p{i}" for i in range(n_params))
    return (
        f".version 8.0\n.target sm_80\n.address_size 64\n"
        f".visible .entry {name}({params})\n{{\n  ret;\n}}\n\0"
    ).encode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--stub-kernels",
        action="store_true",
        help="time the Python around the kernels on any backend (see above)",
    )
    stubbed = parser.parse_args().stub_kernels
    if stubbed:
        stub_kernels()
    install_attention_dispatch()
    cache = TurboQuantKVCache("turbo4")
    kv = mx.random.normal((1, 8, 4096, 128)).astype(mx.float16)
    cache.update_and_fetch(kv, kv)
    query = mx.random.normal((1, 32, 1, 128)).astype(mx.float16)
    view, _ = cache.update_and_fetch(kv[:, :, :1], kv[:, :, :1])
    cache.settle()  # a plain view (a decode token may wait for its launch's encoding)
    mx.eval(query, view.stored, view.new_keys, view.new_values)
    keys, values = view.new_keys, view.new_values

    def fused():
        return decode_attention.fused_decode_attention(query, view, 0.1, None)

    print(f"{mx.default_device()}, kernels {'stubbed' if stubbed else 'compiled'}")
    print("| call | us per call |")
    print("|---|---:|")
    per_call(
        "mx.fast.scaled_dot_product_attention",
        lambda: mx.fast.scaled_dot_product_attention(query, keys, values, scale=0.1),
    )
    mx.eval(fused())
    sizes = {n: len(source(n)) for n in ("decode_attention.cu", "common.cuh")}
    per_call(
        f"fused decode attention, stripped source ({sum(sizes.values())} chars)", fused
    )
    token = kv[:, :, :1]
    fp16 = KVCache()
    fp16.update_and_fetch(kv, kv)
    for label, layer_cache in (("fp16 KVCache", fp16), ("turbo4", cache)):

        def layer(c=layer_cache):
            keys, values = c.update_and_fetch(token, token)
            return mlx_base.scaled_dot_product_attention(
                query, keys, values, cache=c, scale=0.1, mask=None
            )

        per_call(f"a decode layer, {label}: cache update + attention", layer, 500)
    if stubbed:
        return
    written = {n: (_SOURCES / n).read_text() for n in sizes}
    decode_attention.forget_kernels()
    decode_attention.source = written.__getitem__
    mx.eval(fused())  # compiled once
    chars = sum(map(len, written.values()))
    per_call(f"fused decode attention, source as written ({chars} chars)", fused)

    calls = []
    (plan,) = decode_attention._LAYERS[view.codec].plans.values()
    kernel = plan.kernel
    plan.kernel = lambda **kw: calls.append(kw) or kernel(**kw)
    fused()
    plan.kernel = kernel
    (arguments,) = calls
    per_call("its mx.fast.cuda_kernel call alone", lambda: kernel(**arguments))
    empty = mx.fast.cuda_kernel(
        name="empty",
        input_names=list(plan.at),
        output_names=["out", "work"],
        source="",
        ensure_row_contiguous=False,
    )
    mx.eval(empty(**arguments))
    per_call(
        f"empty kernel, {len(arguments['inputs'])} inputs (no template values: the "
        "call's are in its header)",
        lambda: empty(**arguments),
    )
    # the call's template values as the call passed them before they went to the header
    template = [
        (name, getattr(mx, value) if isinstance(value, str) else value)
        for name, value in plan.constants
    ]
    per_call(
        f"the same with {len(template)} template values",
        lambda: empty(**arguments, template=template),
    )
    options = {k: v for k, v in arguments.items() if k != "inputs"}
    compiled = mx.compile(lambda *inputs: empty(inputs=list(inputs), **options))
    mx.eval(compiled(*arguments["inputs"]))
    per_call(
        "the same inside mx.compile (replayed at the same shapes)",
        lambda: compiled(*arguments["inputs"]),
    )
    precompiled = arguments
    n_params = len(arguments["inputs"]) + len(arguments["output_shapes"])
    binary = empty_ptx("empty_ptx", n_params)

    def from_ptx():
        return mx.fast.precompiled_cuda_kernel(
            name="empty_ptx", compiled_source=binary, scalars=[], **precompiled
        )

    mx.eval(from_ptx())
    per_call("the same as PTX through mx.fast.precompiled_cuda_kernel", from_ptx)
    tiny = mx.fast.cuda_kernel(
        name="empty1", input_names=["q"], output_names=["out"], source=""
    )
    one = dict(
        inputs=[query],
        template=[("T", mx.float16)],
        grid=(32, 1, 1),
        threadgroup=(32, 1, 1),
        output_shapes=[query.shape],
        output_dtypes=[query.dtype],
    )
    mx.eval(tiny(**one))
    per_call("empty kernel, 1 input, 1 template value", lambda: tiny(**one))


if __name__ == "__main__":
    main()
