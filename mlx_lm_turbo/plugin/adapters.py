"""Architecture adapters: how a model family gets TurboQuant caches.

An adapter turns the caches mlx-lm would build into compressed ones, within what
its capability flags allow. ``Adapter`` itself serves every model whose caches are
``KVCache`` / ``RotatingKVCache`` (state caches left untouched) and whose
attention hands the fetched keys and values to mlx-lm's
``scaled_dot_product_attention`` (read from the model's source: ``structure.py``);
any other model is refused with the reason. ``builtin.py`` lists which model types
use which adapter.
"""

import weakref
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Optional, Tuple

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache

from ..cache.kv_cache import TurboQuantKVCache
from ..cache.rotating_cache import TurboQuantRotatingKVCache
from ..codec.schemes import KVScheme
from ..errors import UnsupportedModelError
from .hookspecs import hookimpl
from .structure import attention_problem, model_modules

# The caches an adapter compresses, exactly these types (a subclass may store more).
CACHE_KINDS = {mlx_cache.KVCache: "kv", mlx_cache.RotatingKVCache: "rotating"}
# Caches that hold no keys and values (linear attention, Mamba state): left as they are.
STATE_CACHES = (mlx_cache.ArraysCache,)


def refusal(model_type, why) -> str:
    """The message for a model the plugin cannot serve: what, why, and what to do."""
    return (
        f"mlx-lm-turbo cannot serve model type {model_type!r}: {why}. "
        "Run it without --kv-scheme."
    )


@dataclass(frozen=True)
class Capabilities:
    # Sliding-window (RotatingKVCache) layers get the compressed ring buffer; an
    # adapter without it refuses models that have such layers.
    supports_sliding_window: bool = True
    notes: str = ""


@dataclass(frozen=True)
class LayerPlan:
    """What one entry of the cache list becomes, and why."""

    index: int  # the entry in this process's cache list
    kind: str  # "kv", "rotating", "state"
    scheme: Optional[KVScheme]
    reason: str
    layer: int  # the model's layer number (also the rotation seed); differs from index on a pipeline rank


@dataclass
class Adapter:
    name: str
    model_types: Tuple[str, ...]
    capabilities: Capabilities = field(default_factory=Capabilities)

    def plan(
        self,
        model,
        scheme: KVScheme,
        *,
        boundary_skip,
        layer_schemes=None,
        max_kv_size=None,
    ):
        """(mlx-lm's caches for this process, their plans, the plans of every model layer).

        Under a pipeline group this process holds layers ``start`` onwards only, but
        boundaries and per-layer overrides are the model's layer numbers, so the plan
        is made for the whole model and cut to this process's share.
        """
        problem = attention_problem(model)
        if problem:
            raise UnsupportedModelError(refusal(model_type_of(model), problem))
        caches = mlx_make_prompt_cache(model, max_kv_size)
        cache_types, start = whole_model_cache_types(model, caches, max_kv_size)
        kinds = []
        for i, t in enumerate(cache_types):
            kind = CACHE_KINDS.get(t) or (
                "state" if issubclass(t, STATE_CACHES) else None
            )
            if kind is None:
                raise UnsupportedModelError(
                    refusal(
                        model_type_of(model),
                        f"its layer {i} keeps a {t.__name__}, which TurboQuant cannot compress",
                    )
                )
            if kind == "rotating" and not self.capabilities.supports_sliding_window:
                raise UnsupportedModelError(
                    refusal(
                        model_type_of(model),
                        f"its layer {i} has a sliding window, which the {self.name} adapter does not handle",
                    )
                )
            kinds.append(kind)
        attention = [i for i, k in enumerate(kinds) if k != "state"]
        if not attention:
            raise UnsupportedModelError(
                refusal(model_type_of(model), "it has no KV-cache layers to compress")
            )
        plans = []
        for i, kind in enumerate(kinds):
            if kind == "state":
                plans.append(LayerPlan(i, kind, None, "recurrent state, kept as is", i))
                continue
            rank = attention.index(i)
            if layer_schemes and i in layer_schemes:
                plans.append(
                    LayerPlan(i, kind, layer_schemes[i], "per-layer override", i)
                )
            elif rank < boundary_skip or rank >= len(attention) - boundary_skip:
                plans.append(
                    LayerPlan(
                        i,
                        kind,
                        boundary_scheme(scheme),
                        f"boundary: attention layer {rank} of {len(attention)}",
                        i,
                    )
                )
            else:
                plans.append(LayerPlan(i, kind, scheme, "scheme", i))
        mine = [
            replace(p, index=p.layer - start)
            for p in plans[start : start + len(caches)]
        ]
        return caches, mine, plans

    def build(self, caches, plans, **cache_options):
        """Replace the planned entries of ``caches`` (mlx-lm's) with TurboQuant caches."""
        for p in plans:
            c = caches[p.index]
            if p.scheme is None:
                continue
            if p.kind == "rotating":
                caches[p.index] = TurboQuantRotatingKVCache(
                    p.scheme, c.max_size, c.keep, layer=p.layer, **cache_options
                )
            else:
                caches[p.index] = TurboQuantKVCache(
                    p.scheme, layer=p.layer, **cache_options
                )
        return caches


@lru_cache(maxsize=None)
def model_module_verdicts():
    """{each model module of the installed mlx-lm: None if served, else why not}."""
    return model_modules(
        [c.__name__ for c in CACHE_KINDS], [c.__name__ for c in STATE_CACHES]
    )


def mlx_make_prompt_cache(model, max_kv_size=None):
    """mlx-lm's own ``make_prompt_cache``, even once the plugin has wrapped it."""
    make = mlx_cache.make_prompt_cache
    return getattr(make, "turbo_original", make)(model, max_kv_size)


# (id(model), max_kv_size) -> (cache type of each model layer, first layer this process holds).
_WHOLE_MODEL_LAYOUTS = {}


def whole_model_cache_types(model, caches, max_kv_size=None):
    """The type of mlx-lm's cache for every layer of the model, and the first layer
    this process holds (``caches``: mlx-lm's caches for this process).

    A pipeline rank (``model.model.pipeline(group)``, as ``sharded_load`` does) keeps
    only its layers, so the whole layout comes from an unloaded copy of the model
    (lazy weights, never evaluated), made once per model.
    """
    inner = getattr(model, "model", None)
    if getattr(inner, "pipeline_size", 1) <= 1:
        return [type(c) for c in caches], 0
    key = (id(model), max_kv_size)
    if key not in _WHOLE_MODEL_LAYOUTS:
        args = getattr(model, "args", None)
        if args is None:
            raise UnsupportedModelError(
                refusal(
                    model_type_of(model),
                    "it is pipeline-sharded but keeps no args to rebuild its layer layout from",
                )
            )
        # The copy's random init draws from MLX's global key; restore the key so that
        # sampling with a set seed goes as without the plugin.
        saved_key = mx.array(mx.random.state[0])
        mx.eval(saved_key)
        whole = mlx_make_prompt_cache(type(model)(args), max_kv_size)
        mx.random.state[0][...] = saved_key
        _WHOLE_MODEL_LAYOUTS[key] = ([type(c) for c in whole], inner.start_idx)
        weakref.finalize(model, _WHOLE_MODEL_LAYOUTS.pop, key, None)
    return _WHOLE_MODEL_LAYOUTS[key]


# id(model) -> per cache entry, (key dim, value dim) or None.
_HEAD_DIMS = {}


def head_dims(model):
    """Per entry of mlx-lm's caches, (KV heads, key dim, value dim) or None, from one token
    traced lazily (nothing is computed), once per model; None if the model cannot be
    traced so (it needs other inputs: mlx-lm reports that when it runs).

    Through mlx-lm's caches, not ours: our codebooks and rotations are cached
    process-wide as lazy arrays, and built on this thread the server's generation
    thread could not evaluate them (MLX streams belong to a thread).
    """
    if id(model) not in _HEAD_DIMS:
        caches = mlx_make_prompt_cache(model)
        try:
            model(mx.array([[0]]), cache=caches)
            dims = [
                (c.keys.shape[1], c.keys.shape[3], c.values.shape[3])
                if getattr(c, "keys", None) is not None
                else None
                for c in caches
            ]
        except Exception:
            dims = None
        _HEAD_DIMS[id(model)] = dims
        weakref.finalize(model, _HEAD_DIMS.pop, id(model), None)
    return _HEAD_DIMS[id(model)]


def boundary_scheme(scheme: KVScheme) -> KVScheme:
    """The scheme for the first/last attention layers: 8-bit where the scheme has fewer."""
    return KVScheme(
        max(scheme.key_bits, 8) if scheme.key_bits else 0,
        max(scheme.value_bits, 8),
        scheme.compact,
    )


def model_type_of(model) -> str:
    args = getattr(model, "args", None)
    return (
        getattr(model, "model_type", None)
        or getattr(args, "model_type", None)
        or type(model).__module__.rsplit(".", 1)[-1]
    )


class AdapterPlugin:
    """A plugin object serving adapters by model type (each built-in adapter is one)."""

    def __init__(self, *adapters):
        self.adapters = adapters

    @hookimpl
    def mlx_lm_turbo_adapter(self, model_type, model):
        return next((a for a in self.adapters if model_type in a.model_types), None)

    @hookimpl
    def mlx_lm_turbo_adapters(self):
        return list(self.adapters)


class FallbackAdapterPlugin(AdapterPlugin):
    """Serves its one adapter to every model type, asked after all other plugins."""

    @hookimpl(trylast=True)
    def mlx_lm_turbo_adapter(self, model_type, model):
        return self.adapters[0]
