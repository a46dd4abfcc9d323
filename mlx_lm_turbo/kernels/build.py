"""Building the fused kernels: their sources as MLX's compilers read them, compiled
under names that carry a digest of what they compile, and the small arrays their calls
share. Which kernel runs where is ``dispatch``'s."""

import hashlib
import re
from functools import lru_cache
from pathlib import Path

import mlx.core as mx

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
