"""Keeps qwen3 keys at 8 bits: whatever scheme is asked for, qwen3 models get
``turbo8v4`` (8-bit keys, 4-bit values) and one boundary layer at each end."""

from mlx_lm_turbo import hookimpl


@hookimpl
def mlx_lm_turbo_register_overrides(registry):
    registry.add(
        model_type="qwen3",
        scheme="turbo8v4",
        boundary_skip=1,
        source="turbo-plugin-example",
    )
