"""The mlx-lm versions this plugin is tested against: the one place that says so.

Outside the range the start-up hook patches nothing (mlx-lm runs as if the plugin
were not installed, saying so once when a scheme is asked for) and the Python API
refuses. pyproject.toml's requirement repeats the range for pip; a test keeps the two equal.
"""

import sys

MLX_LM_RANGE = ">=0.32.2,<0.33"


def _version_tuple(text):
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


LOWEST, FIRST_UNTESTED = (
    _version_tuple(bound.lstrip("<>=")) for bound in MLX_LM_RANGE.split(",")
)


def installed_mlx_lm_version() -> str:
    # mlx_lm/__init__.py imports _version first, so this is there while mlx-lm loads.
    from mlx_lm._version import __version__

    return __version__


def supported() -> bool:
    return LOWEST <= _version_tuple(installed_mlx_lm_version()) < FIRST_UNTESTED


def unsupported_message() -> str:
    return (
        f"mlx-lm-turbo is tested with mlx-lm {MLX_LM_RANGE}, but mlx-lm {installed_mlx_lm_version()} is "
        f'installed. Install a tested one (pip install "mlx-lm{MLX_LM_RANGE}") or run without --kv-scheme.'
    )


def check_mlx_lm_version():
    """Raise RuntimeError naming the tested range when the installed mlx-lm is outside it."""
    if not supported():
        raise RuntimeError(unsupported_message())


_noticed = False


def notice_if_scheme_asked(env_scheme):
    """Outside the range: say once, on stderr, that a requested scheme is not applied."""
    global _noticed
    asked = any(
        a == "--kv-scheme" or a.startswith("--kv-scheme=") for a in sys.argv
    ) or env_scheme not in (None, "", "none")
    if asked and not _noticed:
        _noticed = True
        print(
            f"mlx-lm-turbo is inactive, --kv-scheme is not applied: {unsupported_message()}",
            file=sys.stderr,
        )
