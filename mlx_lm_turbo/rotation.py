"""Seeded random rotations of head vectors.

A randomized Hadamard transform (random signs, then ``mx.hadamard_transform``)
where MLX supports the size (n = m * 2^k, m in 1, 12, 20, 28); a dense seeded
random orthogonal matrix for any other head dim. Deterministic per
(seed, layer, head_dim), so a saved cache reloads with the same rotation.
"""

from functools import lru_cache

import mlx.core as mx
import numpy as np

_HADAMARD_BASES = (1, 12, 20, 28)


def _hadamard_size(n):
    return any(n % m == 0 and ((n // m) & (n // m - 1)) == 0 for m in _HADAMARD_BASES)


class Rotation:
    """An orthogonal map R on the last axis: ``forward(x) = R x``, ``inverse(y) = R^T y``."""

    def __init__(self, head_dim: int, seed: int, layer: int):
        rng = np.random.default_rng([seed, layer, head_dim])
        self.head_dim = head_dim
        self.signs = mx.array(rng.choice([-1.0, 1.0], size=head_dim).astype(np.float32))
        self.matrix = None  # row-vector form: forward(x) = x @ matrix
        if _hadamard_size(head_dim):
            hadamard = np.array(mx.hadamard_transform(mx.eye(head_dim)))
            if np.array_equal(hadamard, hadamard.T):
                return
            # Non-symmetric Hadamard bases (m = 20, 28) need H^T for the
            # inverse, which the transform cannot give: use the dense form.
            self.matrix = mx.array((hadamard * np.array(self.signs)[None, :]).T)
        else:
            q, r = np.linalg.qr(rng.standard_normal((head_dim, head_dim)))
            self.matrix = mx.array((q * np.sign(np.diag(r))).astype(np.float32))

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
def rotation(head_dim: int, seed: int, layer: int) -> Rotation:
    return Rotation(head_dim, seed, layer)
