"""The mlx-lm versions this plugin is tested against; others are refused loudly."""

MLX_LM_MIN = (0, 32, 2)
MLX_LM_BELOW = (0, 33, 0)
SUPPORTED_RANGE = ">=0.32.2,<0.33"


def _version_tuple(text):
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def check_mlx_lm_version():
    """Raise RuntimeError naming the supported range when the installed mlx-lm is outside it."""
    from mlx_lm import __version__

    if not MLX_LM_MIN <= _version_tuple(__version__) < MLX_LM_BELOW:
        raise RuntimeError(
            f"mlx-lm-turbo supports mlx-lm {SUPPORTED_RANGE}, but mlx-lm {__version__} is installed. "
            f'Install a supported one (pip install "mlx-lm{SUPPORTED_RANGE}") or run without --kv-scheme.'
        )
