"""Custom GPU kernels, each verified against the portable MLX code it replaces.

- ``encode``: compress incoming keys and values in one launch (reference:
  ``codec.TurboCodec.encode``).
- ``decode_attention``: attention of 1-8 query tokens over a compressed cache,
  reading the packed codes directly (reference: the portable path of
  ``attention.turbo_scaled_dot_product_attention``); at decode it also encodes the
  new token in the same launch (reference: ``encode``).
- ``decode_attention_simd``: the same attention by a simple kernel written once for
  CUDA and Metal; on Apple GPUs, where it has not run yet, only under
  ``MLX_LM_TURBO_KERNEL=on``; its CUDA build verifies the shared source.
- ``prefill_attention``: attention of a prefill chunk, flash attention on the tensor
  cores over the history dequantized in segments (reference: the same portable path).
- ``decode_call``: which calls the decode kernels take, and what they share.
- ``dispatch``: where each runs, and ``MLX_LM_TURBO_KERNEL``.
"""

from .decode_attention import fused_decode_and_encode, fused_decode_attention
from .dispatch import KERNEL_ENV, KernelUnavailableError, kernel_mode, layer_support
from .encode import fused_encode
from .prefill_attention import fused_prefill_attention

__all__ = [
    "KERNEL_ENV",
    "KernelUnavailableError",
    "fused_decode_and_encode",
    "fused_decode_attention",
    "fused_encode",
    "fused_prefill_attention",
    "kernel_mode",
    "layer_support",
]
