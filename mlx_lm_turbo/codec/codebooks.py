"""Lloyd-Max codebooks for one coordinate of a randomly rotated unit vector.

The tables are precomputed by ``scripts/make_codebooks.py`` (never at run time)
and stored as the positive half of each symmetric codebook.
"""

import json
from functools import lru_cache
from pathlib import Path

import mlx.core as mx

from ..errors import UnsupportedModelError

_TABLE_FILE = Path(__file__).with_name("codebooks.json")


@lru_cache(maxsize=None)
def _tables():
    return json.loads(_TABLE_FILE.read_text())


def supported_head_dims():
    return tuple(_tables()["head_dims"])


def check_head_dim(head_dim: int):
    if head_dim not in supported_head_dims():
        raise UnsupportedModelError(
            f"TurboQuant has no codebook for head_dim={head_dim}; supported head dims are "
            f"{', '.join(map(str, supported_head_dims()))}. Run this model without "
            "--kv-scheme (or with turbo0vN only if its value head dim is supported)."
        )


def _entry(head_dim, bits):
    check_head_dim(head_dim)
    return _tables()["tables"][f"{head_dim}/{bits}"]


@lru_cache(maxsize=None)
def codebook(head_dim: int, bits: int) -> mx.array:
    """All 2**bits reconstruction levels, ascending, float32."""
    half = _entry(head_dim, bits)["positive_half"]
    return mx.array([-c for c in reversed(half)] + half, dtype=mx.float32)


@lru_cache(maxsize=None)
def boundaries(head_dim: int, bits: int) -> mx.array:
    """The 2**bits - 1 decision thresholds (midpoints between levels)."""
    levels = codebook(head_dim, bits)
    return (levels[1:] + levels[:-1]) / 2


def optimal_mse(head_dim: int, bits: int) -> float:
    """Expected squared error of a unit vector quantized with this codebook."""
    return _entry(head_dim, bits)["unit_vector_mse"]
