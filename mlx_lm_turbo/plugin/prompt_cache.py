"""Building TurboQuant caches for a loaded mlx-lm model: adapter, overrides, plan."""

from typing import Optional

from ..cache.common import check_integer, check_recent_exact
from ..codec.schemes import KVScheme, parse_scheme
from ..compat import check_mlx_lm_version
from ..defaults import DEFAULT_BOUNDARY_SKIP, DEFAULT_RECENT_EXACT
from ..errors import UnsupportedModelError, UsageError
from .adapters import head_dims, mlx_make_prompt_cache, model_type_of
from .manager import adapter_for
from .registry import registry


def plan(
    model,
    kv_scheme,
    *,
    boundary_skip: int = DEFAULT_BOUNDARY_SKIP,
    max_kv_size: Optional[int] = None,
    model_path: Optional[str] = None,
    layer_schemes: Optional[dict] = None,
):
    """(adapter, caches mlx-lm would build, per-layer plans) after overrides apply.

    ``layer_schemes`` ({cache entry: scheme}) wins over the overrides' per-layer schemes."""
    _check_model(model)
    scheme = parse_scheme(kv_scheme)
    if scheme is None:
        raise ValueError("plan() needs a TurboQuant scheme, not 'none'.")
    check_integer("boundary_skip", boundary_skip)
    given = _check_layer_schemes(layer_schemes)
    model_type = model_type_of(model)
    override = registry().resolve(model_type, model_path)
    if "opt_out" in override:
        raise UnsupportedModelError(
            f"TurboQuant is turned off for model type {model_type!r} by an override "
            f"({override['opt_out']}); run it without --kv-scheme or remove the override."
        )
    if "scheme" in override:
        scheme = parse_scheme(override["scheme"])
    layer_schemes = {
        i: parse_scheme(s)
        for i, s in {**override.get("layer_schemes", {}), **given}.items()
    }
    skip_from = (
        "an override" if "boundary_skip" in override else "--turbo-boundary-skip"
    )
    boundary_skip = override.get("boundary_skip", boundary_skip)
    adapter = adapter_for(model)
    caches, layers, every_layer = adapter.plan(
        model,
        scheme,
        boundary_skip=boundary_skip,
        layer_schemes=layer_schemes,
        max_kv_size=max_kv_size,
    )
    # Checked against the whole model: a pipeline rank holds only some of its layers.
    _check_fits_model(
        model_type,
        every_layer,
        boundary_skip,
        skip_from,
        layer_schemes,
        override["sources"],
        given,
    )
    _check_head_dims(model, layers)
    return adapter, caches, layers, override


def _check_head_dims(model, layers):
    """Refuse a compressed layer whose head dims have no codebook, or no fused kernel
    where MLX_LM_TURBO_KERNEL=on: before anything is built or printed."""
    from ..codec.codebooks import check_head_dim
    from ..kernels.dispatch import KERNEL_ENV, kernel_mode, layer_support

    dims = head_dims(model)
    for p in layers if dims else ():
        if p.scheme is None or dims[p.index] is None:
            continue
        _, key_dim, value_dim = dims[p.index]
        if p.scheme.key_bits:
            check_head_dim(key_dim)
        check_head_dim(value_dim)
        why_not = kernel_mode() == "on" and layer_support(key_dim, value_dim)
        if why_not:
            raise UsageError(
                f"{KERNEL_ENV}=on, but the fused kernels cannot run for cache entry "
                f"{p.index}: {why_not}. Unset it (or set {KERNEL_ENV}=auto)."
            )


def _check_model(model):
    import mlx.nn as nn

    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a loaded mlx-lm model (mlx_lm.load), got {type(model).__name__}."
        )


def _check_layer_schemes(layer_schemes):
    """``layer_schemes`` ({cache entry: scheme}, or None) as a dict, or TypeError /
    ValueError naming what is wrong."""
    if layer_schemes is None:
        return {}
    if not isinstance(layer_schemes, dict):
        raise TypeError(
            "layer_schemes must be a dict {cache entry (an integer >= 0): scheme}, got "
            f"{type(layer_schemes).__name__}."
        )
    for i, scheme in layer_schemes.items():
        check_integer("each layer_schemes key (a cache entry)", i)
        if not isinstance(scheme, (str, KVScheme)):
            raise TypeError(
                f"layer_schemes[{i}] must be a scheme name such as 'turbo8' (or a "
                f"KVScheme), got {scheme!r}."
            )
    return layer_schemes


def _check_fits_model(
    model_type, layers, boundary_skip, skip_from, layer_schemes, sources, given
):
    """Refuse settings that name layers the model does not have (they would be silently
    ignored); ``given``: the layer_schemes passed in (the rest came from overrides)."""
    attention = sum(p.kind != "state" for p in layers)
    if boundary_skip > attention:
        raise UsageError(
            f"A boundary skip of {boundary_skip} ({skip_from}) is more than the {attention} attention "
            f"layers of model type {model_type!r}; {(attention + 1) // 2} already keeps every one at 8 bits."
        )
    for i in sorted(layer_schemes):
        where = (
            f"layer_schemes entry {i}"
            if i in given
            else f"layer_schemes entry {i} of an override ({', '.join(sources)})"
        )
        if i >= len(layers):
            raise UsageError(
                f"The {where} is beyond model type {model_type!r}, whose caches are "
                f"entries 0-{len(layers) - 1}."
            )
        if layers[i].kind == "state":
            raise UsageError(
                f"The {where} names a recurrent-state entry of model type {model_type!r}, "
                "which holds no keys and values to compress."
            )


def make_prompt_cache(
    model,
    kv_scheme,
    *,
    boundary_skip: int = DEFAULT_BOUNDARY_SKIP,
    max_kv_size: Optional[int] = None,
    uncompressed_start: int = 0,
    recent_exact: int = DEFAULT_RECENT_EXACT,
    seed: int = 0,
    key_calibration: Optional[str] = None,
    model_path: Optional[str] = None,
    layer_schemes: Optional[dict] = None,
):
    """mlx-lm's ``make_prompt_cache`` with every KV cache replaced by a TurboQuant one.

    The model's adapter decides which caches are compressed; boundary layers are
    counted among layers that have a KV cache, so hybrid models protect their
    first and last attention layers, not raw indices. Overrides matching the
    model type or ``model_path`` apply, then ``layer_schemes`` ({cache entry: scheme}).
    Each query reads itself and the ``recent_exact - 1`` tokens before it exactly
    (besides the sink tokens); caches with ``recent_exact > 1`` cannot be trimmed.
    ``kv_scheme="none"`` gives mlx-lm's caches.
    """
    _check_model(model)
    scheme = parse_scheme(kv_scheme)
    if scheme is None:
        return mlx_make_prompt_cache(model, max_kv_size)
    check_recent_exact(recent_exact)
    adapter, caches, layers, _ = plan(
        model,
        scheme,
        boundary_skip=boundary_skip,
        max_kv_size=max_kv_size,
        model_path=model_path,
        layer_schemes=layer_schemes,
    )
    check_mlx_lm_version()
    return adapter.build(
        caches,
        layers,
        seed=seed,
        uncompressed_start=uncompressed_start,
        recent_exact=recent_exact,
        key_calibration=key_calibration,
    )
