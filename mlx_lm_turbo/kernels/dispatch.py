"""Which path runs: the fused kernels or the portable MLX code they are verified against.

``MLX_LM_TURBO_KERNEL``: ``auto`` (default) uses a kernel wherever it applies,
``off`` forces the portable path, ``on`` makes a kernel that cannot run an error. On
Apple GPUs, where the Metal kernel has not run yet, only ``on`` uses it.
"""

import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path

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


_SOURCES = Path(__file__).parent


@lru_cache(maxsize=None)
def source(name):
    """A kernel source without comments, indentation or blank lines (Metal's kernels
    are built from the text itself: see ``included`` for CUDA's)."""
    lines = (
        line.split("//")[0].strip()
        for line in (_SOURCES / name).read_text().splitlines()
    )
    return "\n".join(line for line in lines if line)


def included(name):
    """A kernel source file as MLX-CUDA's compiler reads it: an ``#include`` of the
    file, then a comment with a digest of its text (the kernel's name covers it:
    ``cuda_kernel``) and the shapes and strides it reads (MLX passes an input's shape
    or strides where the source names them). MLX-CUDA hashes a custom kernel's whole
    source at every call (its module cache's key) and copies it into every call's
    graph node: the decode kernel's 35 KB would cost each decode layer microseconds on
    the host. Where the path
    cannot be written in an ``#include``, the text itself."""
    path, text = str(_SOURCES / name), source(name)
    if not (path.isascii() and path.isprintable()) or '"' in path or "\\" in path:
        return text + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    named = sorted(set(re.findall(r"\b\w+_(?:shape|strides|ndim)\b", text)))
    return f'#include "{path}"\n// {digest} {" ".join(named)}\n'


def cuda_kernel(name, input_names, output_names, source, header, shared_memory=0):
    """``mx.fast.cuda_kernel`` under a name that carries a digest of what it compiles
    (``shared_memory``: the bytes of dynamic shared memory a block asks for).

    MLX-CUDA keeps each compiled kernel on disk (``MLX_PTX_CACHE_DIR``, else the temp
    directory) and finds it again by the kernel's name and template values alone: under
    a plain name, a later version of the source (an upgrade of this package) would run
    the binary compiled from the earlier one."""
    return _named_kernel(
        mx.fast.cuda_kernel,
        name,
        input_names,
        output_names,
        source,
        header,
        shared_memory=shared_memory,
    )


def metal_kernel(name, input_names, output_names, source, header):
    """``mx.fast.metal_kernel``, named as ``cuda_kernel`` names CUDA's (MLX's Metal
    backend keeps compiled libraries only in memory and rebuilds one whose source
    changed, so there the digest is only for uniformity)."""
    return _named_kernel(
        mx.fast.metal_kernel, name, input_names, output_names, source, header
    )


def _named_kernel(build, name, input_names, output_names, source, header, **options):
    text = "\0".join([*input_names, *output_names, header, source, str(options)])
    return build(
        name=f"{name}_{hashlib.sha256(text.encode()).hexdigest()[:16]}",
        input_names=list(input_names),
        output_names=list(output_names),
        source=source,
        header=header,
        ensure_row_contiguous=False,
        **options,
    )


def broadcast_rows(a, rows):
    """``a`` with ``rows`` rows on axis 0: a view where it has one row shared by all."""
    return a if a.shape[0] == rows else mx.broadcast_to(a, (rows, *a.shape[1:]))


@lru_cache(maxsize=None)
def placeholder(dtype):
    """A one-element array standing for an input a variant does not read (evaluated at
    once, so no thread's stream is tied to it)."""
    array = mx.zeros((1,), dtype)
    mx.eval(array)
    return array
