import mlx.core as mx
import numpy as np
import pytest

from mlx_lm_turbo.codec.rotation import Rotation, rotation, splitmix64_signs


@pytest.mark.parametrize(
    "head_dim, dense",
    [
        (64, False),
        (96, False),
        (128, False),
        (256, False),
        (80, True),
        (112, True),
        (160, True),
    ],
)
def test_orthogonal_and_invertible(head_dim, dense):
    r = rotation(head_dim, 0, 5)
    assert (r.matrix is not None) == dense
    x = mx.random.normal((7, head_dim), key=mx.random.key(0))
    y = r.forward(x)
    # tolerances allow GPU matmuls' reduced-precision float32 (TF32)
    assert mx.allclose(
        mx.linalg.norm(y, axis=-1), mx.linalg.norm(x, axis=-1), rtol=2e-3
    ).item()
    assert mx.allclose(r.inverse(y), x, atol=5e-3).item()
    # inner products are preserved, which is what attention needs
    assert mx.allclose(y @ y.T, x @ x.T, rtol=5e-3, atol=5e-2).item()


def test_deterministic_per_seed_and_layer():
    x = mx.random.normal((3, 128), key=mx.random.key(1))
    a, b = Rotation(128, 7, 2), Rotation(128, 7, 2)
    assert mx.array_equal(a.forward(x), b.forward(x)).item()
    assert not mx.allclose(Rotation(128, 7, 3).forward(x), a.forward(x)).item()
    assert not mx.allclose(Rotation(128, 8, 2).forward(x), a.forward(x)).item()


def test_spreads_an_outlier_channel():
    x = mx.zeros((1, 128))
    x[0, 3] = 1.0
    y = np.array(rotation(128, 0, 0).forward(x))
    assert np.allclose(np.abs(y), 1 / np.sqrt(128))


def flipped(signs):
    return sum(1 << i for i, s in enumerate(signs) if s < 0)


def test_signs_are_the_projects_own_definition():
    """Saved caches rely on these exact signs: SplitMix64, written in rotation.py, pinned here
    so that no change of code, NumPy or MLX alters them silently."""
    assert flipped(splitmix64_signs(64, 0, 0)) == 0x4D20042AB778295B
    assert flipped(splitmix64_signs(128, 0, 1)) == 0xA847CAB1486ECB3B32DA0616555CC4A7
    assert flipped(splitmix64_signs(80, 7, 3)) == 0x9B3E7C292D98D69A3C1E
    assert np.array_equal(
        np.array(rotation(128, 0, 1).signs), splitmix64_signs(128, 0, 1)
    )


def test_sizes_without_a_hadamard_transform_are_refused():
    with pytest.raises(ValueError, match="No Hadamard transform of size 72"):
        Rotation(72, 0, 0)
