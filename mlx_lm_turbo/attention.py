"""Attention over TurboQuant caches, in the rotated domain.

The query is calibrated and rotated once, keys and values are dequantized
straight into the rotated domain (codebook level times norm, no per-key inverse
rotation), ``mx.fast.scaled_dot_product_attention`` runs there with whatever
mask and sinks the model passes, and the output is rotated back once.
"""

from typing import Optional, Union

import mlx.core as mx

from .cache import TurboKV
from .kernels import fused_decode_attention


def _causal_mask(n_queries, n_keys):
    # Lower-right aligned, as mx.fast.scaled_dot_product_attention's "causal".
    return mx.arange(n_keys - n_queries, n_keys)[:, None] >= mx.arange(n_keys)[None]


def _add_score_shift(mask, shift, n_keys):
    """Fold a per-query additive score shift (B, Hq, L, 1) into any mask kind."""
    if mask is None:
        return shift
    if isinstance(mask, str):
        mask = _causal_mask(shift.shape[2], n_keys)
    if mask.dtype == mx.bool_:
        return mx.where(mask, shift, mx.finfo(shift.dtype).min)
    return mask.astype(shift.dtype) + shift


def turbo_scaled_dot_product_attention(
    queries: mx.array,
    kv: TurboKV,
    scale: float,
    mask: Union[None, str, mx.array],
    sinks: Optional[mx.array] = None,
) -> mx.array:
    fused = fused_decode_attention(queries, kv, scale, mask, sinks)
    if fused is not None:
        return fused
    codec = kv.codec
    keys, values = kv.keys_and_values()
    if sinks is not None:
        # Centring keys shifted every score of a query by q.mean; softmax alone
        # ignores that, but not once a sink logit competes, so add it back.
        shift = codec.score_shift(queries, scale)
        if shift is not None:
            mask = _add_score_shift(mask, shift.astype(queries.dtype), keys.shape[2])
    output = mx.fast.scaled_dot_product_attention(
        codec.prepare_queries(queries), keys, values, scale=scale, mask=mask, sinks=sinks
    )
    return codec.restore_output(output)
