"""Fused decode attention over TurboQuant-packed caches (MLX-CUDA).

Computes what ``attention.turbo_scaled_dot_product_attention`` computes from the
same ``TurboKV`` (that portable path is the reference it is tested against), for
queries of 1 to ``MAX_QUERIES`` tokens, without materialising dequantized K/V:

``decode_attention.cu``: one block per (slice of the cached tokens, KV head, group
of query rows). It rotates the query rows once, reads each token's packed codes
and fp16 norms, decodes them against the codebook in shared memory and keeps an
online softmax per row; the exact tokens (sink tokens, the current chunk) form one
more slice, read from their copies in the model's dtype. Each slice writes its
unnormalised output rows and their (max, sum); the last slice of a group to finish
merges them (log-sum-exp), adds a GPT-OSS attention-sink logit, rotates the rows
back out of the value rotation and casts them.

One kernel a layer: on MLX-CUDA each op of a chained decode step costs tens of
microseconds, most of it on the host (benchmarks/results/decode_kernel_h200_*.md);
a second kernel for the merge measured slower (decode_kernel_h200_809a21d.md).
"""

import math
import weakref
from functools import lru_cache

import mlx.core as mx

from ..codec.codebooks import codebook
from .dispatch import broadcast_rows, placeholder, source, use_kernel

MAX_QUERIES = (
    8  # decode and speculative decoding's verify step; longer queries are prefill
)
WARPS = 4
# Each lane accumulates (rows x head_dim / 32) output values in registers: at most 32.
MAX_ROW_VALUES = 1024
# Slicing: at least a tile per warp in each slice, and about this many blocks in all,
# enough to fill the GPU without making the combine long.
MIN_SLICE_TOKENS = 32 * WARPS
TARGET_BLOCKS = (
    512  # benchmarks/results/decode_kernel_h200_b9c1d8e.md: best at 4K and 128K
)
# The merging block keeps a weight per part and query row in its staging memory
# (at least WARPS * 64 * rows floats): parts (slices + 1) <= 256 fit at every head dim.
MAX_SLICES = 255
MAX_SINKS = 64  # exact tokens held apart from the tail, per sequence
MAX_GROUP = 255  # query heads per KV head (8 bits of the SHAPE template value)


def _call_support(queries, kv, mask):
    """Why this call goes to the portable path although the layer is served; None if not."""
    if queries.shape[2] > MAX_QUERIES:
        return "prefill"
    if queries.shape[1] // kv.codec.n_kv_heads > MAX_GROUP:
        return f"more than {MAX_GROUP} query heads per KV head"
    if kv.stored is None:
        return "no compressed history yet"
    if queries.dtype != kv.codec.dtype:
        return "queries and cache differ in dtype"
    if kv.sinks is not None and kv.sinks[0].shape[2] > MAX_SINKS:
        return f"more than {MAX_SINKS} sink tokens"
    if isinstance(mask, str) and mask != "causal":
        return f"mask {mask!r}"
    if isinstance(mask, mx.array) and mask.shape[-1] != kv.stored[-1].shape[2]:
        return "a mask that does not span the cache"
    return None


def fused_decode_attention(queries, kv, scale, mask, sinks=None):
    """The fused kernel's output for this call, or None where the portable path runs."""
    if not use_kernel(kv.codec) or _call_support(queries, kv, mask) is not None:
        return None
    return _cuda_decode_attention(queries, kv, scale, mask, sinks)


# A call's host cost grows with its inputs and template values
# (benchmarks/results/decode_kernel_h200_7f83f00.md): the codec's constants come as one
# input, the variant's yes/no choices as one template value.
INPUTS = (
    "q",
    "consts",
    "kscale",
    "keys",
    "rows",
    "sink_keys",
    "sink_values",
    "sink_pos",
    "tail_keys",
    "tail_values",
    "mask",
    "sink_logits",
    "counters",
    "previous",
)
HEADER_CONSTANTS = f"constexpr int MAX_SINKS = {MAX_SINKS};\n"
# Warps an SM should hold: a block's registers are capped so that 16 warps fit
# (128 registers a thread). Left to itself MLX's compiler gave the kernel 161, so only
# 3 blocks of 4 warps ran per SM and the kernel was a quarter slower at 128K
# (benchmarks/results/decode_kernel_h200_c57a44c.md).
WARPS_PER_SM = 16


def launch_bounds(warps):
    """A header line giving the kernel launch bounds: MLX declares it ``__global__ void
    ...`` after the header, so ``__global__`` is redefined as CUDA's own definition
    (``__location__(global)``) plus the bounds."""
    blocks = max(1, WARPS_PER_SM // warps)
    return (
        "#undef __global__\n"
        f"#define __global__ __location__(global) __launch_bounds__({32 * warps}, {blocks})\n"
    )


def flags(mask_kind, mask_bool, kscale, tail, sink_tokens, sink_logits):
    """The FLAGS template value: the mask kind (0 none, 1 causal, 2 an array) in bits
    0-1, then whether the mask is bool, the keys have a calibration scale, an exact
    tail, sink tokens, attention-sink logits (the kernel's MASK_KIND ... HAS_SINKS)."""
    return (
        mask_kind
        | mask_bool << 2
        | kscale << 3
        | tail << 4
        | sink_tokens << 5
        | sink_logits << 6
    )


@lru_cache(maxsize=None)
def _kernel(warps):
    return mx.fast.cuda_kernel(
        name="turbo_decode_attention",
        input_names=list(INPUTS),
        output_names=["out", "work"],
        source=source("decode_attention.cu"),
        header=launch_bounds(warps) + HEADER_CONSTANTS + source("common.cuh"),
        ensure_row_contiguous=False,
    )


def _slices(n_tokens, blocks_per_slice):
    """How many slices to cut a cache of n_tokens into (the kernel sizes them alike)."""
    return max(
        1,
        min(
            math.ceil(n_tokens / MIN_SLICE_TOKENS),
            math.ceil(TARGET_BLOCKS / blocks_per_slice),
            MAX_SLICES,
        ),
    )


class _Layer:
    """What one cache layer's calls share: its constants input (built once per codec and
    scale), its group counters, and its last call's output. Each call takes that output
    as an input (unread): MLX then orders the calls, which could otherwise overlap on
    the GPU and share counters."""

    def __init__(self, dtype):
        self.scale = self.consts = self.counters = None
        self.previous = placeholder(dtype)

    def constants(self, codec, scale):
        if self.scale != scale:
            D = codec.value_dim
            key_bits = codec.scheme.key_bits
            parts = [
                codec.key_rotation.signs if key_bits else mx.zeros((D,), mx.float32),
                codec.value_rotation.signs,
                *([codebook(D, key_bits)] if key_bits else []),
                codebook(D, codec.scheme.value_bits),
                mx.array([scale], mx.float32),
            ]
            self.consts = mx.concatenate(parts)
            mx.eval(self.consts)
            self.scale = scale
        return self.consts

    def zeroed_counters(self, groups):
        if self.counters is None or self.counters.size < groups:
            self.counters = mx.zeros((groups,), mx.uint32)
            mx.eval(self.counters)  # before any call, so no launch fills it
        return self.counters


_LAYERS = weakref.WeakKeyDictionary()  # codec -> _Layer


def _mask_input(mask, shape):
    """(mask kind, the mask broadcast to (B, Hq, L, T) as a view, or a placeholder)."""
    if mask is None or (isinstance(mask, str) and shape[2] == 1):
        return 0, placeholder(mx.bool_)
    if isinstance(mask, str):
        return 1, placeholder(mx.bool_)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    return 2, mx.broadcast_to(mask, shape)


def _cuda_decode_attention(queries, kv, scale, mask, sinks):
    codec = kv.codec
    B, n_q_heads, L, D = queries.shape
    H = codec.n_kv_heads
    G = n_q_heads // H
    dtype = queries.dtype
    *stored_keys, rows = kv.stored  # keys stored as they are (turbo0vN), then the rows
    stored_keys = stored_keys[0] if stored_keys else placeholder(dtype)
    n_tokens = rows.shape[2]

    n_exact = 0 if kv.new_keys is None else kv.new_keys.shape[2]
    tail_keys, tail_values = (
        (kv.new_keys, kv.new_values) if n_exact else (placeholder(dtype),) * 2
    )
    n_sinks = 0
    sink_keys, sink_values, sink_pos = (
        placeholder(dtype),
        placeholder(dtype),
        placeholder(mx.int32),
    )
    if kv.sinks is not None:
        keys, values, positions = kv.sinks
        n_sinks = keys.shape[2]
        sink_keys, sink_values, sink_pos = (
            broadcast_rows(a, B) for a in (keys, values, positions)
        )
    kscale = placeholder(mx.float32)
    if codec.key_scale is not None:
        kscale = broadcast_rows(codec.key_scale, B)
    mask_kind, mask_arg = _mask_input(mask, (B, n_q_heads, L, n_tokens))

    query_rows = min(G * L, MAX_ROW_VALUES // D)
    row_groups = math.ceil(G * L / query_rows)
    n_slices = _slices(n_tokens, B * H * row_groups)
    has_exact = n_exact + n_sinks > 0
    n_parts = n_slices + has_exact
    window = getattr(kv, "window", None) or 0

    sink_logits = placeholder(mx.float32)
    if sinks is not None:
        logits = mx.broadcast_to(
            sinks.astype(mx.float32)[None, :, None], (B, n_q_heads, L)
        )
        shift = codec.score_shift(queries, scale)
        if shift is not None:  # centring moved every score by it; move the sink instead
            logits = logits - shift[..., 0]
        sink_logits = mx.contiguous(logits * math.log2(math.e))
    groups = B * H * row_groups
    layer = _LAYERS.get(codec)
    if layer is None:
        layer = _LAYERS[codec] = _Layer(dtype)
    out, _ = _kernel(WARPS)(
        inputs=[
            queries,
            layer.constants(codec, scale),
            kscale,
            stored_keys,
            rows,
            sink_keys,
            sink_values,
            sink_pos,
            tail_keys,
            tail_values,
            mask_arg,
            sink_logits,
            layer.zeroed_counters(groups),
            layer.previous,
        ],
        template=template(
            dtype,
            mask_arg.dtype,
            D,
            G,
            L,
            query_rows,
            codec.scheme.key_bits,
            codec.scheme.value_bits,
            WARPS,
            window,
            flags(
                mask_kind,
                mask_arg.dtype == mx.bool_,
                codec.key_scale is not None,
                n_exact > 0,
                n_sinks > 0,
                sinks is not None,
            ),
        ),
        grid=(n_parts * 32 * WARPS, groups, 1),
        threadgroup=(32 * WARPS, 1, 1),
        # each group's parts (query rows x D) and their (max, sum)
        output_shapes=[queries.shape, (groups * n_parts * query_rows * (D + 2),)],
        output_dtypes=[dtype, mx.float32],
    )
    layer.previous = out
    return out


@lru_cache(maxsize=None)
def template(
    dtype, mask_dtype, D, G, L, R, key_bits, value_bits, warps, window, flag_bits
):
    """A variant's template values (one list per variant, built once; the warps per
    block are one, not a header constant: benchmarks/decode_kernel_sweep.py varies them).
    The integers go packed in two (the kernel unpacks them as constants): MLX's host
    cost of a call grows with its template values (kernel_host_cost.py)."""
    return [
        ("T", dtype),
        ("MT", mask_dtype),
        ("SHAPE", D | G << 10 | L << 18 | R << 22),
        ("CODE", key_bits | value_bits << 4 | warps << 8 | flag_bits << 13),
        ("WINDOW", window),
    ]
