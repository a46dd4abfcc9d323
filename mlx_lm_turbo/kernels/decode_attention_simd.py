"""Decode attention over TurboQuant-packed caches from one kernel source, for CUDA and
Metal (Apple GPUs, which cannot run ``decode_attention.cu``'s tensor-core code).

Computes what ``attention.turbo_scaled_dot_product_attention`` computes from the same
``TurboKV`` (its portable path is the reference), for queries of 1 to
``decode_call.MAX_QUERIES`` tokens, as ``decode_attention.cu`` does but simply: no
tensor cores, no asynchronous copies, no encoding of a raw decode token, two launches.

``decode_attention_simd.body``: one threadgroup per (slice of the tokens, KV head,
group of query rows) writes the slice's unnormalised rows and their (max, sum);
``decode_attention_simd_merge.body``: one per (KV head, group of query rows) merges
the slices (log-sum-exp), adds a GPT-OSS attention-sink logit, rotates the rows back
out of the value rotation and casts them. Both bodies are written once, in the subset
of CUDA C++ and Metal Shading Language both compile, with a backend's prelude
(``simd_prelude_cuda.h``, ``simd_prelude_metal.h``: barriers, simd-group sums and
maxes, type conversions, address spaces) and a few source lines naming the thread
indices (``INDICES``). The CUDA build runs on the H200 against the portable path, which
verifies the shared bodies; the Metal build has never run on an Apple GPU.
"""

import math
import weakref
from functools import lru_cache

import mlx.core as mx

from ..codec.codebooks import codebook
from .build import (
    broadcast_rows,
    cuda_kernel,
    included,
    metal_kernel,
    placeholder,
    source,
)
from .decode_call import (
    ATTENTION_INPUTS,
    MAX_SINKS,
    call_support,
    flags,
    sink_logits,
)
from .dispatch import head_dims_support

SIMD_GROUPS = 4  # per threadgroup
THREADS = 32 * SIMD_GROUPS
# Each lane accumulates (rows x head_dim / 32) output values: at most 32.
MAX_ROW_VALUES = 1024
# Slicing: a tile per simd-group in each slice at least, about this many threadgroups.
MIN_SLICE_TOKENS = THREADS
TARGET_THREADGROUPS = 512
MAX_PARTS = 64  # the merge keeps a weight per part and row in threadgroup memory

MERGE_INPUTS = ("parts", "stats", "consts", "sink_logits")
# The thread indices the shared bodies name. Metal's lines go in the source, not the
# header: MLX adds an attribute to the kernel's signature where the source names it.
INDICES = {
    "metal": (
        "const int group_x = int(threadgroup_position_in_grid.x);\n"
        "const int group_y = int(threadgroup_position_in_grid.y);\n"
        "const int n_groups_x = int(threadgroups_per_grid.x);\n"
        "const int tid = int(thread_index_in_threadgroup);\n"
        "const int lane = int(thread_index_in_simdgroup);\n"
        "const int sg = int(simdgroup_index_in_threadgroup);\n"
    ),
    "cuda": (
        "const int group_x = blockIdx.x, group_y = blockIdx.y, n_groups_x = gridDim.x;\n"
        "const int tid = threadIdx.x, lane = threadIdx.x % 32, sg = threadIdx.x / 32;\n"
    ),
}
CONSTANTS = f"constexpr int MAX_SINKS = {MAX_SINKS}, MAX_PARTS = {MAX_PARTS};\n"
BODIES = ("decode_attention_simd.body", "decode_attention_simd_merge.body")


def kernel_text(backend, name):
    """A source file as ``backend``'s kernels take it (CUDA's: ``included``)."""
    return included(name) if backend == "cuda" else source(name) + "\n"


def kernel_source(backend, body):
    """A shared body as ``backend``'s kernel source: its index lines first."""
    return INDICES[backend] + CONSTANTS + kernel_text(backend, body)


def kernel_header(backend):
    """``backend``'s prelude (CUDA's names common.cuh's helpers), then the shared helpers."""
    parts = ["common.cuh"] if backend == "cuda" else []
    parts += [f"simd_prelude_{backend}.h", "decode_attention_simd.h"]
    return "".join(kernel_text(backend, name) for name in parts)


@lru_cache(maxsize=None)
def kernels(backend):
    """(partials kernel, merge kernel) built for ``backend`` ('cuda' or 'metal')."""
    build = cuda_kernel if backend == "cuda" else metal_kernel
    header = kernel_header(backend)
    partials, merge = (kernel_source(backend, body) for body in BODIES)
    return (
        build(
            "turbo_simd_attention",
            ATTENTION_INPUTS,
            ("parts", "stats"),
            partials,
            header,
        ),
        build("turbo_simd_merge", MERGE_INPUTS, ("out",), merge, header),
    )


def simd_call_support(queries, kv, mask):
    """Why this call goes to the portable path; None if the SIMD kernels take it."""
    codec = kv.codec
    return call_support(queries, kv, mask) or head_dims_support(
        codec.key_dim, codec.value_dim
    )


def simd_decode_attention(queries, kv, scale, mask, sinks, backend):
    """The SIMD kernels' output for this call, built for ``backend`` ('cuda', 'metal'),
    or None where the portable path runs: a call they do not cover
    (``simd_call_support``), or a decode token its cache has not encoded yet
    (``kv.pending``: the cache encodes it first, as for ``fused_decode_attention``)."""
    if kv.pending is not None or simd_call_support(queries, kv, mask) is not None:
        return None
    return simd_launch(queries, kv, scale, mask, sinks, backend)


def simd_launch(queries, kv, scale, mask, sinks, backend):
    """The SIMD kernels' output for a call checked already (``simd_decode_attention``'s
    checks, which ``fused_decode_attention`` makes too)."""
    codec = kv.codec
    B, n_q_heads, L, D = queries.shape
    H = codec.n_kv_heads
    G = n_q_heads // H
    R = min(G * L, MAX_ROW_VALUES // D)
    row_groups = math.ceil(G * L / R)
    groups = B * H * row_groups
    *stored_keys, rows = kv.stored  # keys stored as they are (turbo0vN), then the rows
    n_tokens = rows.shape[2]
    dtype = queries.dtype

    mask_kind, mask_input = 0, placeholder(mx.bool_)
    if isinstance(mask, str) and L > 1:
        mask_kind = 1
    elif isinstance(mask, mx.array):
        mask_kind = 2
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        mask_input = mx.broadcast_to(mask, (B, n_q_heads, L, n_tokens))
    sink_inputs = [placeholder(dtype), placeholder(dtype), placeholder(mx.int32)]
    if kv.sinks is not None:
        sink_inputs = [broadcast_rows(a, B) for a in kv.sinks]
    tail = kv.new_keys is not None
    has_exact = tail or kv.sinks is not None
    inputs = [
        queries,
        _constants(codec, scale),
        placeholder(mx.float32)
        if codec.key_scale is None
        else broadcast_rows(codec.key_scale, B),
        stored_keys[0] if stored_keys else placeholder(dtype),
        rows,
        *sink_inputs,
        kv.new_keys if tail else placeholder(dtype),
        kv.new_values if tail else placeholder(dtype),
        mask_input,
    ]
    slices = max(
        1,
        min(
            math.ceil(n_tokens / MIN_SLICE_TOKENS),
            math.ceil(TARGET_THREADGROUPS / groups),
            MAX_PARTS - has_exact,
        ),
    )
    n_parts = slices + has_exact
    flag_bits = flags(
        mask_kind,
        mask_input.dtype == mx.bool_,
        codec.key_scale is not None,
        tail,
        kv.sinks is not None,
        False,  # the sink logits are the merge's
    )
    partials, merge = kernels(backend)
    parts, stats = partials(
        inputs=inputs,
        template=[
            ("T", dtype),
            ("MT", mask_input.dtype),
            ("D", D),
            ("G", G),
            ("L", L),
            ("R", R),
            ("KB", codec.scheme.key_bits),
            ("VB", codec.scheme.value_bits),
            ("NW", SIMD_GROUPS),
            ("FLAGS", flag_bits),
            ("WINDOW", kv.window or 0),
        ],
        grid=(n_parts * THREADS, groups, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[
            (B, H, row_groups, n_parts, R, D),
            (B, H, row_groups, n_parts, R, 2),
        ],
        output_dtypes=[mx.float32, mx.float32],
    )
    logits = placeholder(mx.float32)
    if sinks is not None:
        logits = sink_logits(queries, codec, scale, sinks)
    (out,) = merge(
        inputs=[parts, stats, inputs[1], logits],
        template=[
            ("T", dtype),
            ("D", D),
            ("G", G),
            ("L", L),
            ("R", R),
            ("NW", SIMD_GROUPS),
            ("HAS_SINKS", int(sinks is not None)),
        ],
        grid=(THREADS, groups, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[queries.shape],
        output_dtypes=[dtype],
    )
    return out


_CONSTANTS = weakref.WeakKeyDictionary()  # codec -> {scale: consts}


def _constants(codec, scale):
    """The kernels' ``consts`` (see decode_attention_simd.body), built once per codec
    and scale."""
    by_scale = _CONSTANTS.setdefault(codec, {})
    consts = by_scale.get(scale)
    if consts is None:
        D = codec.value_dim
        key_bits, value_bits = codec.scheme.key_bits, codec.scheme.value_bits
        q_scale = scale * math.log2(math.e) * (D**-0.5 if key_bits else 1.0)
        consts = mx.concatenate(
            [
                mx.array([q_scale, D**-0.5], mx.float32),
                codec.key_rotation.signs if key_bits else mx.zeros((D,), mx.float32),
                codec.value_rotation.signs,
                *([codebook(D, key_bits)] if key_bits else []),
                codebook(D, value_bits),
            ]
        )
        mx.eval(consts)
        by_scale[scale] = consts
    return consts
