"""Custom GPU kernels, each beside the portable MLX path it is verified against.

- ``decode_attention``: attention of 1-8 query tokens over a compressed cache on
  MLX's CUDA backend, reading the packed codes directly (reference:
  ``attention.turbo_scaled_dot_product_attention``'s portable path).
"""

from .decode_attention import (KERNEL_ENV, KernelUnavailableError, fused_decode_attention,
                               kernel_mode, layer_support)

__all__ = ["KERNEL_ENV", "KernelUnavailableError", "fused_decode_attention", "kernel_mode",
           "layer_support"]
