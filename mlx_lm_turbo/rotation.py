"""Seeded random rotations of head vectors.

A randomized Hadamard transform: random signs, then ``mx.hadamard_transform``
(every head dim with a codebook is a size MLX supports, n = m * 2^k with m in
1, 12, 20, 28). A saved cache must reload with the same rotation, so the signs
come from SplitMix64 over (seed, layer, head_dim, dimension): integer arithmetic
written here, the same under every NumPy and MLX version.

Release 0.1.0 drew the signs from NumPy's ``Generator``, whose stream NumPy does
not promise to keep. Its files are still read with those signs (``LEGACY_SIGNS``)
while this NumPy reproduces the draws 0.1.0 made, and refused once it does not.
"""

from functools import lru_cache

import mlx.core as mx
import numpy as np

SIGNS = "splitmix64"  # saved with each codec
LEGACY_SIGNS = "numpy-generator"  # release 0.1.0's files, which name no source
_HADAMARD_BASES = (1, 12, 20, 28)
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
# The signs NumPy's Generator gave release 0.1.0 (NumPy 2.4) for (seed, layer, head_dim):
# bit i set where dimension i was flipped.
_LEGACY_DRAWS = {(0, 0, 64): 0x61608F81DF39F060, (0, 1, 128): 0xAEA5956902D829CFE4F613E923AFC3A5,
                 (7, 3, 80): 0x2FD06B246DF78BC90585}


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
    return [-1.0 if _mix((state + (i + 1) * _GOLDEN) & _MASK) >> 63 else 1.0 for i in range(head_dim)]


def legacy_signs(head_dim, seed, layer):
    """The signs release 0.1.0 drew (NumPy's Generator)."""
    return list(np.random.default_rng([seed, layer, head_dim]).choice([-1.0, 1.0], size=head_dim))


def legacy_signs_reproducible() -> bool:
    """Whether this NumPy still draws what release 0.1.0's NumPy drew."""
    return all(sum(1 << i for i, s in enumerate(legacy_signs(d, seed, layer)) if s < 0) == bits
               for (seed, layer, d), bits in _LEGACY_DRAWS.items())


_SIGN_SOURCES = {SIGNS: splitmix64_signs, LEGACY_SIGNS: legacy_signs}


class Rotation:
    """An orthogonal map R on the last axis: ``forward(x) = R x``, ``inverse(y) = R^T y``."""

    def __init__(self, head_dim: int, seed: int, layer: int, signs: str = SIGNS):
        if not _hadamard_size(head_dim):
            raise ValueError(f"No Hadamard transform of size {head_dim} (sizes m * 2^k, m in {_HADAMARD_BASES}).")
        self.head_dim = head_dim
        self.signs = mx.array(_SIGN_SOURCES[signs](head_dim, seed, layer), dtype=mx.float32)
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
