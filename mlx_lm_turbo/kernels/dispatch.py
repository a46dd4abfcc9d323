"""Which path runs: the fused kernels or the portable MLX code they are verified against.

``MLX_LM_TURBO_KERNEL``: ``auto`` (default) uses a kernel wherever it applies,
``off`` forces the portable path, ``on`` makes a kernel that cannot run an error. On
Apple GPUs, where the Metal kernel has not run yet, only ``on`` uses it.
"""

import os
from functools import lru_cache

import mlx.core as mx

from ..errors import KernelUnavailableError

KERNEL_ENV = "MLX_LM_TURBO_KERNEL"
KERNEL_MODES = ("auto", "on", "off")
HEAD_DIMS = (64, 128, 256)  # the head dims the kernels are built and verified for


def kernel_mode() -> str:
    # Read at every call (tests and users may change it), parsed once per value:
    # a decode step asks once a layer.
    return _mode(os.environ.get(KERNEL_ENV, "auto"))


@lru_cache(maxsize=None)
def _mode(raw: str) -> str:
    value = raw.strip().lower() or "auto"
    if value not in KERNEL_MODES:
        raise ValueError(
            f"{KERNEL_ENV}={value!r} is not one of {', '.join(KERNEL_MODES)}."
        )
    return value


def gpu_backend():
    """'cuda', 'metal' or None: where MLX runs by default."""
    # By value: MLX devices hash by identity, and each default_device() is a new one.
    return _gpu_kind() if mx.default_device() == mx.gpu else None


@lru_cache(maxsize=None)
def _gpu_kind():
    if mx.cuda.is_available():
        return "cuda"
    return "metal" if mx.metal.is_available() else None


def head_dims_support(key_dim, value_dim) -> "str | None":
    """Why no kernel serves a layer of these head dims; None if they can."""
    if key_dim != value_dim:
        return f"key head dim {key_dim} differs from value head dim {value_dim}"
    # These are powers of two, so the codec's rotations are Hadamard transforms,
    # which the kernels apply themselves.
    if value_dim not in HEAD_DIMS:
        return (
            f"head dim {value_dim} (the kernels cover {', '.join(map(str, HEAD_DIMS))})"
        )
    return None


def layer_support(key_dim, value_dim) -> "str | None":
    """Why the fused kernels cannot serve a layer of these head dims here; None if they can."""
    return _layer_support(gpu_backend(), key_dim, value_dim, kernel_mode())


@lru_cache(maxsize=None)
def _layer_support(backend, key_dim, value_dim, mode):
    if backend is None:
        return "MLX runs on the CPU here (the kernels are for GPUs)"
    if backend == "metal" and mode != "on":
        return (
            "the Metal variant of the kernels has not run on an Apple GPU yet "
            f"({KERNEL_ENV}=on enables it)"
        )
    return head_dims_support(key_dim, value_dim)


def layer_served(codec, backend) -> bool:
    """Whether the fused kernels can serve this layer on ``backend`` (what
    ``gpu_backend`` gave the caller: each asking builds an MLX device, and a decode step
    asks at every layer), whatever ``MLX_LM_TURBO_KERNEL`` says (``use_kernel`` reads
    it)."""
    return _layer_support(backend, codec.key_dim, codec.value_dim, "auto") is None


def use_kernel(codec) -> bool:
    """Whether the fused kernels serve this layer (raises under ``on`` where they cannot)."""
    mode = kernel_mode()
    if mode == "off":
        return False
    reason = _layer_support(gpu_backend(), codec.key_dim, codec.value_dim, mode)
    if reason is not None and mode == "on":
        raise KernelUnavailableError(
            f"{KERNEL_ENV}=on, but the fused kernels cannot run: {reason}. "
            f"Unset it (or set {KERNEL_ENV}=auto) to use the portable path where needed."
        )
    return reason is None
