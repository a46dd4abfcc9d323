"""Attention of a prefill chunk over a compressed cache at the tensor cores' speed
(MLX-CUDA).

Computes what the portable path of ``attention.turbo_scaled_dot_product_attention``
computes from the same ``TurboKV`` (its reference in the tests): the history is
dequantized into the attention domain in segments of at most
``WORKSPACE_BYTES`` (one ``dequantize.cu`` launch per segment, the sink tokens
written exactly at their positions), and ``prefill_attention.cu`` runs flash attention over each
segment and then the exact tail, applying the view's rule of which keys a query
reads exactly (its window) by position, with no mask array. A segment's launch
hands its running (output, max, sum) to the next, so a layer's transient memory is
one segment's keys and values plus the chunk's float32 running output, whatever the
context, and the cache never holds an fp16 copy of its history.
"""

from functools import lru_cache
from typing import NamedTuple

import mlx.core as mx

from ..codec.codebooks import codebook
from .build import cuda_kernel, included
from .decode_attention import C_TYPES, DTYPE_NAMES, constants_header
from .dispatch import gpu_backend, kernel_mode, use_kernel
from .wgmma import wgmma_header

# A segment of dequantized history: 128 MiB of keys and values (32K tokens of 8 KV
# heads of 128 dims in fp16).
WORKSPACE_BYTES = 128 << 20
# A window of None: no query position minus this reaches a key.
_NO_WINDOW = 1 << 30
# The running state before a segment's keys: MLX orders a graph's work by its inputs,
# so each launch's state (the segment before) is made before its keys, and one
# segment's dequantized keys are alive at a time.
INPUTS = (
    *("q", "state_o", "state_ml", "ka", "va", "kb", "vb"),
    *("pads", "params", "scale"),
)
OUTPUTS = ("out", "o_out", "ml_out")


def call_support(queries, kv, mask, sinks=None):
    """Why the kernel does not take this call; None if it does."""
    if queries.shape[2] < 2:
        return "a decode step"
    if queries.dtype not in (mx.float16, mx.bfloat16):
        return f"{queries.dtype} queries (the tensor cores take float16, bfloat16)"
    if kv.pending is not None:
        return "a token not encoded yet"
    if isinstance(mask, mx.array):
        return "an array mask"
    if mask is not None and mask != "causal":
        return f"mask {mask!r}"
    if sinks is not None:
        return "attention-sink logits"
    if kv.new_keys is None:
        return "no exact tail"
    B = queries.shape[0]
    if kv.stored[0].shape[0] != B:
        return "stored rows not one a sequence"
    return None


def fused_prefill_attention(queries, kv, scale, mask, left_padding=None, sinks=None):
    """The kernel's output for this call (in the model's domain, as the portable path
    returns it), or None where the portable path runs. ``left_padding``: (B,) keys
    before each batch row's first token no query reads (its mask is then "causal")."""
    if (
        gpu_backend() != "cuda"
        or not use_kernel(kv.codec)
        or call_support(queries, kv, mask, sinks) is not None
    ):
        return None
    return prefill_attention(queries, kv, scale, mask, left_padding)


def segment_tokens(codec, batch, dtype):
    """Tokens of history dequantized at once: ``WORKSPACE_BYTES`` of keys and values."""
    per_token = batch * codec.n_kv_heads * (codec.key_dim + codec.value_dim)
    return max(64, WORKSPACE_BYTES // (per_token * dtype.size))


class Tiling(NamedTuple):
    """A kernel variant's blocks: ``warps`` warps of 16 x ``m_tiles`` query rows each,
    tiles of ``block_keys`` keys, ``blocks_per_sm`` blocks an SM holds at once (the
    registers a thread may use are 64K / (threads x blocks))."""

    wgmma: bool
    warps: int
    m_tiles: int
    block_keys: int
    blocks_per_sm: int

    @property
    def block_queries(self):
        return 16 * self.m_tiles * self.warps

    def shared_bytes(self, head_dim, dtype):
        """Two tiles of keys and values (one read while the next is copied in) and
        the block's queries."""
        return (4 * self.block_keys + self.block_queries) * head_dim * dtype.size


def tiling(head_dim, wgmma):
    if wgmma:
        # Two warpgroups of 64 rows; at head dim 128 the tiles take 160 KiB of shared
        # memory and a thread's scores and running output 128 registers.
        return Tiling(True, 8, 1, 128, 1)
    if head_dim > 128:
        return Tiling(False, 4, 1, 32, 2)
    # Two m-tiles a warp, where 32 rows' running output fits the registers: each key
    # and value fragment loaded from shared memory feeds two tensor-core products.
    return Tiling(False, 4, 2, 64, 2)


def uses_wgmma(head_dim):
    """Whether the warpgroup-MMA variant serves this head dim here: on Hopper GPUs
    (MLX-CUDA compiles for sm_90a there), up to head dim 128 (at 256 its running
    output alone would take 128 registers a thread). Only under
    ``MLX_LM_TURBO_KERNEL=on`` until its tests and speed have run on a Hopper GPU:
    its CPU build and a probe of its operand layouts on an H100 are all that have."""
    return head_dim <= 128 and kernel_mode() == "on" and _hopper()


@lru_cache(maxsize=None)
def _hopper():
    return gpu_backend() == "cuda" and mx.device_info().get("architecture") == "sm_90"


def prefill_attention(queries, kv, scale, mask, left_padding=None):
    """The launches for a call ``call_support`` accepts (on any backend whose
    ``mx.fast.cuda_kernel`` runs them: the tests run them on the CPU)."""
    codec = kv.codec
    B, Hq, L, D = queries.shape
    tiles = tiling(D, uses_wgmma(D))
    Hkv = codec.n_kv_heads
    n_tokens = kv.shape[2]
    n_exact = kv.new_keys.shape[2]
    e0 = n_tokens - n_exact
    window = _NO_WINDOW if kv.window is None else kv.window
    # Keys any query reads from the compressed store: those before the exact tail, and
    # those past every window (the last query's).
    history = min(max(e0, n_tokens - window), n_tokens)
    q = mx.contiguous(codec.prepare_queries(queries))
    kb = mx.contiguous(kv.new_keys.astype(q.dtype))
    vb = mx.contiguous(kv.new_values.astype(q.dtype))
    scale_in = mx.array([scale], mx.float32)
    pads = None if left_padding is None else left_padding.astype(mx.int32)
    step = segment_tokens(codec, B, q.dtype)
    starts = list(range(0, history, step)) or [None]
    state = None
    for start in starts:
        final = start is None or start + step >= history
        if start is None:
            ka = va = None
            a0 = na = 0
        else:
            a0, na = start, min(step, history - start)
            ka, va = _history(codec, kv, a0, na, q.dtype)
        params = mx.array(
            [
                *(n_tokens, L, window, e0, a0, na, n_exact, mask is not None),
                *(Hq, Hkv, 0 if ka is None else ka.shape[2]),
            ],
            mx.int32,
        )
        outputs = _launch(
            tiles,
            q,
            ka,
            va,
            kb if final else None,
            vb if final else None,
            state,
            pads,
            params,
            scale_in,
            final,
        )
        state = outputs
    out = codec.restore_output(state[0])
    settle_layer(out)
    return out


# The last prefill layer's output while the device runs it. A chunk's layers form one
# graph, in which each layer's dequantizing reads only its cache: left lazy, MLX could
# run every layer's before the first layer's attention and hold them all. Each call
# waits for the one before instead, so at most two layers' temporaries are alive (the
# last output stays referenced here until the next call).
_in_flight = []


def settle_layer(out):
    """Queue ``out`` (a prefill layer's attention output) and wait for the one before."""
    mx.async_eval(out)
    if _in_flight:
        mx.eval(_in_flight.pop())
    _in_flight.append(out)


def _history(codec, kv, start, count, dtype):
    """Stored tokens [start, start + count + 1) dequantized in ``dtype``, the sink
    tokens among the first ``count`` exact. The last is not read: there always is one
    (the exact tail's last token is read from the tail alone), and its slot takes the
    sink tokens of other segments."""
    *exact_keys, rows = (a[:, :, start : start + count + 1] for a in kv.stored)
    keys, values = dequantize(codec, rows, dtype)
    if keys is None:  # keys stored as they are
        keys = mx.contiguous(exact_keys[0].astype(dtype))
    if kv.sinks is not None:
        sink_keys, sink_values, positions = kv.sinks
        inside = (positions >= start) & (positions < start + count)
        slots = mx.where(inside, positions - start, count)
        keys, values = (
            with_sinks(a, sink, slots)
            for a, sink in ((keys, sink_keys), (values, sink_values))
        )
    return keys, values


def dequantize(codec, rows, dtype):
    """(keys or None where they are stored as they are, values): ``rows`` (B, H, N,
    row words) dequantized into the attention domain in ``dtype``, one launch
    (``dequantize.cu``; reference: ``codec.decode``)."""
    B, H, N, _ = rows.shape
    D = codec.value_dim
    key_bits, value_bits = codec.scheme.key_bits, codec.scheme.value_bits
    outputs = _dequantizer(
        dtype, D, key_bits, value_bits, codec.key_words, rows.shape[3]
    )(
        inputs=[rows, _levels(D, key_bits, value_bits)],
        grid=(-(-N * D // 8 // 256) * 256, H, B),
        threadgroup=(256, 1, 1),
        output_shapes=[(B, H, N, D)] * (2 if key_bits else 1),
        output_dtypes=[dtype] * (2 if key_bits else 1),
    )
    return (outputs[1], outputs[0]) if key_bits else (None, outputs[0])


@lru_cache(maxsize=None)
def _levels(head_dim, key_bits, value_bits):
    parts = [codebook(head_dim, value_bits)]
    if key_bits:
        parts.insert(0, codebook(head_dim, key_bits))
    levels = mx.concatenate([p.astype(mx.float32) for p in parts])
    mx.eval(levels)
    return levels


@lru_cache(maxsize=None)
def _dequantizer(dtype, head_dim, key_bits, value_bits, key_words, row_words):
    T = C_TYPES[DTYPE_NAMES[dtype]]
    outputs = ["values_out", "keys_out"] if key_bits else ["values_out"]
    header = (
        f"using T = {T};\n"
        + constants_header(
            (
                ("D", head_dim),
                ("KB", key_bits),
                ("VB", value_bits),
                ("KW", key_words),
                ("RW", row_words),
            )
        )
        + ("" if key_bits else f"__device__ {T}* const keys_out = nullptr;\n")
        + included("common.cuh")
    )
    return cuda_kernel(
        "turbo_dequantize",
        ["rows", "levels"],
        outputs,
        included("dequantize.cu"),
        header=header,
    )


def with_sinks(dense, sink, positions):
    """``dense`` (B, H, T, D) with the exact sink tokens written at their positions
    (B|1, 1, S, 1). (A batch row's unfilled sink slot points at the last token, whose
    stored slot no query reads: each reads itself from the exact tail.)"""
    B, H, _, D = dense.shape
    index = mx.broadcast_to(positions, (B, H, positions.shape[2], D))
    return mx.put_along_axis(dense, index, sink.astype(dense.dtype), axis=2)


def _launch(tiles, q, ka, va, kb, vb, state, pads, params, scale, final):
    B, Hq, L, D = q.shape
    given = {"q": q, "params": params, "scale": scale}
    if ka is not None:
        given.update(ka=ka, va=va)
    if kb is not None:
        given.update(kb=kb, vb=vb)
    if state is not None:
        given.update(state_o=state[0], state_ml=state[1])
    if pads is not None:
        given.update(pads=pads)
    names = tuple(n for n in INPUTS if n in given)
    if final:
        shapes, dtypes = [q.shape], [q.dtype]
    else:
        shapes, dtypes = [q.shape, (B, Hq, L, 2)], [mx.float32, mx.float32]
    return _kernel(tiles, q.dtype, D, names, final)(
        inputs=[given[n] for n in names],
        grid=(Hq * 32 * tiles.warps, -(-L // tiles.block_queries), B),
        threadgroup=(32 * tiles.warps, 1, 1),
        output_shapes=shapes,
        output_dtypes=dtypes,
    )


@lru_cache(maxsize=None)
def _kernel(tiles, dtype, head_dim, names, final):
    """The kernel of a call passing the inputs ``names``."""
    outputs, header = kernel_text(tiles, dtype, head_dim, names, final)
    return cuda_kernel(
        "turbo_prefill_attention",
        list(names),
        outputs,
        included("prefill_attention.cu"),
        header=header,
        shared_memory=tiles.shared_bytes(head_dim, dtype),
    )


def kernel_text(tiles, dtype, head_dim, names, final):
    """(output names, header) of ``_kernel``'s variant (scripts/compile_kernels.py
    compiles them offline): the inputs not in ``names`` are declared as null pointers,
    which the kernel's constants keep it from reading."""
    T = C_TYPES[DTYPE_NAMES[dtype]]
    outputs = ["out"] if final else ["o_out", "ml_out"]
    absent = "".join(
        f"__device__ {'const ' if n in INPUTS else ''}{_type(n, T)}* const {n} = nullptr;\n"
        for n in (*INPUTS, *OUTPUTS)
        if n not in names and n not in outputs
    )
    constants = (
        ("D", head_dim),
        ("BN", tiles.block_keys),
        ("MT", tiles.m_tiles),
        ("WARPS", tiles.warps),
    )
    header = (
        "#undef __global__\n"
        "#define __global__ __location__(global) "
        f"__launch_bounds__({32 * tiles.warps}, {tiles.blocks_per_sm})\n"
        f"using T = {T};\n"
        + constants_header(constants)
        + "".join(
            f"constexpr bool {name} = {str(value).lower()};\n"
            for name, value in (
                ("IS_BF16", dtype == mx.bfloat16),
                ("WGMMA", tiles.wgmma),
                ("HAS_A", "ka" in names),
                ("HAS_B", "kb" in names),
                ("STATE_IN", "state_o" in names),
                ("HAS_PADS", "pads" in names),
                ("FINAL", final),
            )
        )
        + absent
        + included("common.cuh")
        # Declared in both variants (the kernel is one function, whose discarded
        # branches still name them); only the WGMMA variant emits the instructions.
        + wgmma_header((tiles.block_keys, head_dim))
    )
    return outputs, header


def _type(name, T):
    if name in ("state_o", "state_ml", "scale", "o_out", "ml_out"):
        return "float"
    if name in ("params", "pads"):
        return "int32_t"
    return T
