"""Building TurboQuant caches for a loaded mlx-lm model: adapter, overrides, plan."""

from typing import Optional

from .adapters import mlx_make_prompt_cache, model_type_of
from .errors import UnsupportedModelError
from .integration import install
from .plugins import adapter_for
from .registry import registry
from .schemes import parse_scheme


def plan(model, kv_scheme, *, boundary_skip: int = 2, max_kv_size: Optional[int] = None,
         model_path: Optional[str] = None):
    """(adapter, caches mlx-lm would build, per-layer plans) after overrides apply."""
    scheme = parse_scheme(kv_scheme)
    if scheme is None:
        raise ValueError("plan() needs a TurboQuant scheme, not 'none'.")
    if boundary_skip < 0:
        raise ValueError(f"boundary_skip must be >= 0, got {boundary_skip}.")
    model_type = model_type_of(model)
    override = registry().resolve(model_type, model_path)
    if "opt_out" in override:
        raise UnsupportedModelError(
            f"TurboQuant is turned off for model type {model_type!r} by an override "
            f"({override['opt_out']}); run it without --kv-scheme or remove the override."
        )
    scheme = parse_scheme(override.get("scheme", scheme))
    layer_schemes = {i: parse_scheme(s) for i, s in override.get("layer_schemes", {}).items()}
    adapter = adapter_for(model)
    caches, layers = adapter.plan(model, scheme, boundary_skip=override.get("boundary_skip", boundary_skip),
                                  layer_schemes=layer_schemes, max_kv_size=max_kv_size)
    return adapter, caches, layers, override


def make_prompt_cache(model, kv_scheme, *, boundary_skip: int = 2,
                      max_kv_size: Optional[int] = None, uncompressed_start: int = 0,
                      seed: int = 0, key_calibration: Optional[str] = None,
                      model_path: Optional[str] = None):
    """mlx-lm's ``make_prompt_cache`` with every KV cache replaced by a TurboQuant one.

    The model's adapter decides which caches are compressed; boundary layers are
    counted among layers that have a KV cache, so hybrid models protect their
    first and last attention layers, not raw indices. Overrides matching the
    model type or ``model_path`` apply. ``kv_scheme="none"`` gives mlx-lm's caches.
    """
    if parse_scheme(kv_scheme) is None:
        return mlx_make_prompt_cache(model, max_kv_size)
    adapter, caches, layers, _ = plan(model, kv_scheme, boundary_skip=boundary_skip,
                                      max_kv_size=max_kv_size, model_path=model_path)
    install()
    return adapter.build(caches, layers, seed=seed, uncompressed_start=uncompressed_start,
                         key_calibration=key_calibration)
