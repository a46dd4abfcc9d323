"""Building TurboQuant caches for a loaded mlx-lm model."""

from typing import Optional

from mlx_lm.models import cache as mlx_cache

from .cache import TurboQuantKVCache, TurboQuantRotatingKVCache
from .integration import install
from .schemes import KVScheme, parse_scheme

# Caches that hold no keys and values (linear attention, Mamba state): left as they are.
STATE_CACHES = (mlx_cache.ArraysCache,)


def boundary_scheme(scheme: KVScheme) -> KVScheme:
    """The scheme for the first/last attention layers: 8-bit where the scheme has fewer."""
    return KVScheme(max(scheme.key_bits, 8) if scheme.key_bits else 0,
                    max(scheme.value_bits, 8), scheme.compact)


def layer_schemes(n_attention_layers: int, scheme: KVScheme, boundary_skip: int):
    """One scheme per attention layer: the first and last ``boundary_skip`` get 8 bits."""
    if boundary_skip < 0:
        raise ValueError(f"boundary_skip must be >= 0, got {boundary_skip}.")
    return [
        boundary_scheme(scheme) if i < boundary_skip or i >= n_attention_layers - boundary_skip
        else scheme
        for i in range(n_attention_layers)
    ]


def make_prompt_cache(model, kv_scheme, *, boundary_skip: int = 2,
                      max_kv_size: Optional[int] = None, uncompressed_start: int = 0,
                      seed: int = 0, key_calibration: Optional[str] = None):
    """mlx-lm's ``make_prompt_cache`` with every KV cache replaced by a TurboQuant one.

    Boundary layers are counted among layers that have a KV cache, so hybrid
    models protect their first and last attention layers, not raw indices.
    """
    scheme = parse_scheme(kv_scheme)
    caches = mlx_cache.make_prompt_cache(model, max_kv_size)
    if scheme is None:
        return caches
    kv_layers = []
    for i, c in enumerate(caches):
        if type(c) in (mlx_cache.KVCache, mlx_cache.RotatingKVCache):
            kv_layers.append(i)
        elif not isinstance(c, STATE_CACHES):
            raise ValueError(
                f"TurboQuant cannot compress the {type(c).__name__} cache of model type "
                f"{getattr(model, 'model_type', type(model).__name__)!r} (layer {i}); run this "
                "model without --kv-scheme."
            )
    if not kv_layers:
        raise ValueError("This model has no KV cache layers for TurboQuant to compress.")
    install()
    options = dict(seed=seed, uncompressed_start=uncompressed_start, key_calibration=key_calibration)
    for i, layer_scheme in zip(kv_layers, layer_schemes(len(kv_layers), scheme, boundary_skip)):
        c = caches[i]
        if isinstance(c, mlx_cache.RotatingKVCache):
            caches[i] = TurboQuantRotatingKVCache(layer_scheme, c.max_size, c.keep, layer=i, **options)
        else:
            caches[i] = TurboQuantKVCache(layer_scheme, layer=i, **options)
    return caches
