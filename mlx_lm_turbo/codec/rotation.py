"""Seeded random rotations of head vectors.

A randomized Hadamard transform: random signs, then ``mx.hadamard_transform``
(every head dim with a codebook is a size MLX supports, n = m * 2^k with m in
1, 12, 20, 28). A saved cache must reload with the same rotation, so the signs
come from SplitMix64 over (seed, layer, head_dim, dimension): integer arithmetic
written here, the same under every NumPy and MLX version.

Release 0.1.0 drew the signs from NumPy's ``Generator``, whose stream NumPy does
not promise to keep; its files are refused (``cache.check_format`` says why).
"""

from functools import lru_cache

import mlx.core as mx
import numpy as np

SIGNS = "splitmix64"  # saved with each codec
_HADAMARD_BASES = (1, 12, 20, 28)
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _hadamard_size(n):
    return any(n % m == 0 and ((n // m) & (n // m - 1)) == 0 for m in _HADAMARD_BASES)


def _mix(z):
    """SplitMix64's output function."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def splitmix64_signs(head_dim, seed, layer):
    """+1/-1 per dimension: the top bit of SplitMix64's stream seeded by (seed, layer, head_dim)."""
    state = 0
    for part in (seed, layer, head_dim):
        state = _mix(((state ^ part) + _GOLDEN) & _MASK)
    return [
        -1.0 if _mix((state + (i + 1) * _GOLDEN) & _MASK) >> 63 else 1.0
        for i in range(head_dim)
    ]


_SIGN_SOURCES = {SIGNS: splitmix64_signs}


class Rotation:
    """An orthogonal map R on the last axis: ``forward(x) = R x``, ``inverse(y) = R^T y``."""

    def __init__(self, head_dim: int, seed: int, layer: int, signs: str = SIGNS):
        if not _hadamard_size(head_dim):
            raise ValueError(
                f"No Hadamard transform of size {head_dim} (sizes m * 2^k, m in {_HADAMARD_BASES})."
            )
        self.head_dim = head_dim
        self.signs = mx.array(
            _SIGN_SOURCES[signs](head_dim, seed, layer), dtype=mx.float32
        )
        self.matrix = None  # row-vector form: forward(x) = x @ matrix
        hadamard = np.array(mx.hadamard_transform(mx.eye(head_dim)))
        if not np.array_equal(hadamard, hadamard.T):
            # Non-symmetric Hadamard bases (m = 20, 28) need H^T for the
            # inverse, which the transform cannot give: use the dense form.
            self.matrix = mx.array((hadamard * np.array(self.signs)[None, :]).T)

    def forward(self, x: mx.array) -> mx.array:
        x = x.astype(mx.float32)
        if self.matrix is None:
            return mx.hadamard_transform(x * self.signs)
        return x @ self.matrix

    def inverse(self, y: mx.array) -> mx.array:
        y = y.astype(mx.float32)
        if self.matrix is None:
            return mx.hadamard_transform(y) * self.signs
        return y @ self.matrix.T


@lru_cache(maxsize=None)
def rotation(head_dim: int, seed: int, layer: int, signs: str = SIGNS) -> Rotation:
    return Rotation(head_dim, seed, layer, signs)
