import mlx.core as mx
import pytest


def relative_error(a, b):
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return (mx.linalg.norm(a - b) / mx.linalg.norm(b)).item()


def outlier_keys(shape, seed=0, outlier_channels=4, bias=8.0):
    """Keys like real models': a per-channel bias and a few channels of large magnitude."""
    B, H, T, D = shape
    k1, k2, k3 = mx.random.split(mx.random.key(seed), 3)
    keys = mx.random.normal(shape, key=k1)
    channel_bias = bias * mx.random.normal((1, H, 1, D), key=k2) / D**0.5
    spread = mx.ones((D,))
    idx = mx.random.randint(0, D, (outlier_channels,), key=k3)
    spread[idx] = 10.0
    return keys * spread + channel_bias


@pytest.fixture
def rel_err():
    return relative_error
