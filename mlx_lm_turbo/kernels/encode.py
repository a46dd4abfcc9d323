"""Fused encoding of incoming keys and values (MLX-CUDA).

One launch does what ``codec.TurboCodec.encode`` (the portable reference) does in
some twenty MLX ops per layer: calibrate the keys, rotate, quantize against the
codebook, correct the norms, pack the codes, and keep the exact rotated copies.
On MLX-CUDA each of those small ops costs tens of microseconds in a decode step.
Rounding differs from the portable path's (the rotation's sums run in another
order), so a coordinate that falls within float error of a codebook boundary
can take the neighbouring code: tests bound how often.
"""

from functools import lru_cache

import mlx.core as mx

from ..codec.codebooks import boundaries, codebook
from .dispatch import broadcast_rows, placeholder, source, use_kernel

WARPS = 4


@lru_cache(maxsize=None)
def _kernel():
    return mx.fast.cuda_kernel(
        name="turbo_encode",
        input_names=[
            "keys",
            "values",
            "key_mean",
            "key_scale",
            "k_signs",
            "v_signs",
            "k_bounds",
            "k_levels",
            "v_bounds",
            "v_levels",
        ],
        output_names=["rows", "exact_keys", "exact_values"],
        source=source("encode.cu"),
        header=source("common.cuh"),
        ensure_row_contiguous=False,
    )


def fused_encode(codec, keys, values):
    """``codec.encode(keys, values)`` by the fused kernel, or None where it does not run."""
    if not use_kernel(codec):
        return None
    B, H, L, D = values.shape
    kb, vb = codec.scheme.key_bits, codec.scheme.value_bits
    n = B * H * L
    dtype = codec.dtype

    def statistic(stat):
        return placeholder(mx.float32) if stat is None else broadcast_rows(stat, B)

    k_bounds, k_levels, k_signs = (
        (boundaries(D, kb), codebook(D, kb), codec.key_rotation.signs)
        if kb
        else (placeholder(mx.float32),) * 3
    )
    rows, exact_keys, exact_values = _kernel()(
        inputs=[
            keys,
            values,
            statistic(codec.key_mean),
            statistic(codec.key_scale),
            k_signs,
            codec.value_rotation.signs,
            k_bounds,
            k_levels,
            boundaries(D, vb),
            codebook(D, vb),
        ],
        template=[
            ("T", dtype),
            ("D", D),
            ("KB", kb),
            ("VB", vb),
            ("NW", WARPS),
            ("CENTER", codec.key_mean is not None),
            ("SCALE", codec.key_scale is not None),
        ],
        grid=(-(-n // WARPS) * WARPS * 32, 1, 1),
        threadgroup=(WARPS * 32, 1, 1),
        output_shapes=[
            (B, H, L, codec.row_words),
            (B, H, L, D) if kb else (1,),
            (B, H, L, D),
        ],
        output_dtypes=[mx.uint32, dtype, dtype],
    )
    if kb:
        return (rows,), exact_keys, exact_values
    return (keys, rows), keys, exact_values
