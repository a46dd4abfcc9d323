"""Fused encoding of incoming keys and values (MLX-CUDA).

One launch does what ``codec.TurboCodec.encode`` (the portable reference) does in
some twenty MLX ops per layer: calibrate the keys, rotate, quantize against the
codebook, correct the norms, pack the codes, and keep the exact rotated copies.
On MLX-CUDA each of those small ops costs tens of microseconds in a decode step.
Rounding differs from the portable path's (the rotation's sums run in another
order), so a coordinate that falls within float error of a codebook boundary
can take the neighbouring code: tests bound how often.
"""

import weakref
from functools import lru_cache

import mlx.core as mx

from ..codec.codebooks import boundaries, codebook
from .build import broadcast_rows, cuda_kernel, included, placeholder
from .decode_attention import DTYPE_NAMES, constants_header
from .dispatch import gpu_backend, use_kernel

WARPS = 4
# The codec's constants come as one input (a call's host cost grows with its inputs).
INPUTS = ("keys", "values", "key_mean", "key_scale", "consts")


@lru_cache(maxsize=None)
def _kernel(constants):
    """The kernel for the template values ``constants`` (``template``), which its
    header declares."""
    return cuda_kernel(
        "turbo_encode",
        INPUTS,
        ["rows", "exact_keys", "exact_values"],
        included("encode.cu"),
        header=constants_header(constants) + included("common.cuh"),
    )


_PLANS = weakref.WeakKeyDictionary()  # codec -> {batch rows: (inputs, kernel)}


def _plan(codec, B):
    """The inputs after the keys and values (key statistics for B rows, the codec's
    constants) and the kernel of a codec's calls on B rows, built once: on MLX-CUDA
    the host's time per call counts at every decode step. The inputs are left lazy:
    the first call's launch evaluates them with its own graph. (Evaluating them here
    would make a prompt's first chunk wait, at every layer, for all the work queued
    before: the statistics are measured on the layer's keys.)"""
    plans = _PLANS.get(codec)
    if plans is None:
        plans = _PLANS[codec] = {}
    plan = plans.get(B)
    if plan is None:
        plan = plans[B] = (
            [
                placeholder(mx.float32) if stat is None else broadcast_rows(stat, B)
                for stat in (codec.key_mean, codec.key_scale)
            ]
            + [_constants(codec)],
            _kernel(
                template(
                    DTYPE_NAMES[codec.dtype],
                    codec.value_dim,
                    codec.scheme.key_bits,
                    codec.scheme.value_bits,
                    codec.key_mean is not None,
                    codec.key_scale is not None,
                )
            ),
        )
    return plan


def _constants(codec):
    """Key signs, value signs, key boundaries and levels, value boundaries and levels:
    one float32 array per codec."""
    D = codec.value_dim
    key_bits, value_bits = codec.scheme.key_bits, codec.scheme.value_bits
    key_signs = codec.key_rotation.signs if key_bits else mx.zeros((D,), mx.float32)
    key_tables = [boundaries(D, key_bits), codebook(D, key_bits)] if key_bits else []
    return mx.concatenate(
        [
            key_signs,
            codec.value_rotation.signs,
            *key_tables,
            boundaries(D, value_bits),
            codebook(D, value_bits),
        ]
    )


def template(dtype, D, key_bits, value_bits, center, scale):
    """A variant's template values (the dtype by name): the head dim, key and value
    bits, warps a block, and whether the key calibration's mean and scale are inputs.
    The kernel's header declares them (``constants_header``)."""
    return (
        ("T", dtype),
        ("D", D),
        ("KB", key_bits),
        ("VB", value_bits),
        ("NW", WARPS),
        ("CENTER", int(center)),
        ("SCALE", int(scale)),
    )


def fused_encode(codec, keys, values):
    """``codec.encode(keys, values)`` by the fused kernel, or None where it does not run."""
    if not use_kernel(codec) or gpu_backend() != "cuda":  # Metal has no encode kernel
        return None
    B, H, L, D = values.shape
    n = B * H * L
    inputs, kernel = _plan(codec, B)
    rows, exact_keys, exact_values = kernel(
        inputs=[keys, values, *inputs],
        grid=(-(-n // WARPS) * WARPS * 32, 1, 1),
        threadgroup=(WARPS * 32, 1, 1),
        output_shapes=[
            (B, H, L, codec.row_words),
            (B, H, L, D) if codec.scheme.key_bits else (1,),
            (B, H, L, D),
        ],
        output_dtypes=[mx.uint32, codec.dtype, codec.dtype],
    )
    if codec.scheme.key_bits:
        return (rows,), exact_keys, exact_values
    return (keys, rows), keys, exact_values
