"""What the single and batch caches share: the helpers both build on, and
``CacheCommon``, the base of both (query calibration, the sink tokens in the attention
domain, the refusal to trim a cache that reads recent tokens exactly)."""

import copy

import mlx.core as mx

from ..codec.codec import TurboCodec, query_energy
from ..compat import check_mlx_lm_version
from ..kernels.encode import fused_encode
from .view import TurboKV

# Every later query attends to a sequence's first tokens (attention sinks), so their
# quantization error reaches every step: this many are kept exact, read exactly by
# every query that sees them, and the key statistics are measured on them, so they never
# depend on how the prompt was chunked or on what a prompt cache reused.
SINK_TOKENS = 16


def held(value):
    """``value`` as it is now, kept from in-place updates of its arrays (MLX's
    ``a[i] = x`` and ``a += x`` change the array object itself)."""
    if isinstance(value, mx.array):
        return copy.copy(value)
    if type(value) in (tuple, list):
        return type(value)(held(v) for v in value)
    return value


class QueryCalibration:
    """How a cache gets its sink tokens' queries (``center+query`` calibration,
    ``codec.KEY_CALIBRATIONS``): only attention sees queries, after the update that
    stores the keys. An update that keeps sink tokens is therefore made twice: once
    without its queries, into the view attention gets, then, when attention hands the
    queries over (``TurboKV.calibrating``: ``take_queries``), again from the state
    before it, with them, into the same view. MLX builds graphs lazily: the first
    update's arrays, no longer referenced, never run."""

    _rerun = None  # (view, the cache's state before the update, keys, values)
    _query_energy = None  # the update's codec.query_energy while it is made again
    _first_pass = False

    def _awaits_queries(self) -> bool:
        """Whether this update keeps sink tokens whose queries calibrate the keys."""
        raise NotImplementedError

    def _update_awaiting_queries(self, keys, values):
        before = {name: held(v) for name, v in self.__dict__.items()}
        self._first_pass = True
        try:
            view, _ = self.update_and_fetch(keys, values)
        finally:
            self._first_pass = False
        self._rerun = (view, before, keys, values)
        view.calibrating = self.take_queries
        return view, view

    def take_queries(self, view, queries):
        """Make ``view``'s update again with its queries (attention calls this first)."""
        view.calibrating = None
        if self._rerun is None or self._rerun[0] is not view:
            return  # made again already (a layer sharing this one's keys attends)
        _, before, keys, values = self._rerun
        self.__dict__.clear()
        self.__dict__.update(before)
        self._query_energy = query_energy(queries, self.codec.n_kv_heads)
        try:
            fresh, _ = self.update_and_fetch(keys, values)
        finally:
            self._query_energy = None
        for name in TurboKV.__slots__:
            setattr(view, name, getattr(fresh, name))

    def _wants_query_energy(self):
        return self.codec.calibrates_on_queries and not (
            self._first_pass or self._query_energy is not None
        )

    def _incoming_energy(self, tokens):
        """This update's query energies, (B, H, tokens, D/2), or None (not given, or
        given for other tokens)."""
        energy = self._query_energy
        return energy if energy is not None and energy.shape[2] == tokens else None


def new_codec(cache, keys, values):
    """A codec for ``cache``'s scheme, seed, layer and key calibration, sized by these keys
    and values (never for an mlx-lm outside the tested range, whose attention the plugin
    does not route)."""
    check_mlx_lm_version()
    return TurboCodec.for_keys(
        cache.scheme,
        keys,
        values,
        seed=cache.seed,
        layer=cache.layer,
        key_calibration=cache.key_calibration,
    )


def encode(codec, keys, values, new_tokens=None):
    """``codec.encode(keys, values)``, by the fused kernel where it runs (one launch
    instead of some twenty small ops, each costing tens of microseconds on a GPU).
    With ``new_tokens``, the stored arrays of the last that many tokens only: the ones
    before them (a recent window led in) are encoded for their exact copies alone,
    which a launch makes with the new tokens' instead of a conversion of their own."""
    fused = fused_encode(codec, keys, values)
    stored, exact_keys, exact_values = (
        fused if fused is not None else codec.encode(keys, values)
    )
    if new_tokens is not None and new_tokens < keys.shape[2]:
        stored = tuple(a[:, :, -new_tokens:] for a in stored)
    return stored, exact_keys, exact_values


def led_by_recent(recent, keys, values, keep):
    """(keys, values led by the ``recent`` tokens kept before them, the last ``keep``
    tokens of those to keep for the next chunk). The led chunk is encoded as one: the
    launch gives the recent tokens' exact copies in the current codec's domain with
    the chunk's. The kept tokens are a view where the arrays hold few more (a decode
    step's), a copy where they hold a chunk (a view would keep its K/V alive)."""
    if recent is not None and recent[0].shape[2]:
        keys, values = (
            mx.concatenate([r, a], axis=2) for r, a in zip(recent, (keys, values))
        )
    kept = tuple(
        a[:, :, -keep:] if a.shape[2] <= 2 * keep else mx.contiguous(a[:, :, -keep:])
        for a in (keys, values)
    )
    return keys, values, kept


def check_integer(name, value, least=0, meaning=""):
    """``value`` if it is an integer >= ``least``, else TypeError / ValueError naming
    ``name`` and what it may be."""
    if not isinstance(value, int) or isinstance(value, bool):
        error = TypeError
    elif value < least:
        error = ValueError
    else:
        return value
    raise error(f"{name} must be an integer >= {least}{meaning}, got {value!r}.")


def check_recent_exact(recent_exact):
    """The window of exactly read keys a cache is asked for, or TypeError / ValueError."""
    return check_integer(
        "recent_exact",
        recent_exact,
        1,
        " (1: each query reads only itself and the sink tokens exactly)",
    )


def check_keys_values(keys, values):
    if not (isinstance(keys, mx.array) and isinstance(values, mx.array)):
        raise TypeError("TurboQuant caches take mx.array keys and values.")
    if (
        keys.ndim != 4
        or values.ndim != 4
        or keys.shape[:3] != values.shape[:3]
        or not keys.shape[2]
    ):
        raise ValueError(
            "TurboQuant caches take keys and values shaped (batch, kv_heads, tokens, head_dim) "
            f"with matching leading dims and at least one token; got {keys.shape} and "
            f"{values.shape}."
        )


class CacheCommon(QueryCalibration):
    """What every turbo cache, single or batch, has alike (``sinks`` and ``codec``
    named so in all of them)."""

    def _converted_sink_arrays(self):
        cached = getattr(self, "_converted_sinks", None)
        return [] if cached is None else list(cached[1])

    def _attention_sinks(self):
        """The sink tokens in the attention domain, converted once per codec and sink set."""
        key = (self.codec, self.sinks)
        cached = getattr(self, "_converted_sinks", None)
        if cached is None or cached[0][0] is not key[0] or cached[0][1] is not key[1]:
            self._converted_sinks = (key, self.codec.exact(*self.sinks))
        return self._converted_sinks[1]

    def _refuse_trim(self, n):
        if n > 0 and self.recent_exact > 1 and self.codec is not None:
            raise ValueError(
                f"This TurboQuant cache reads the {self.recent_exact - 1} tokens before each "
                "query exactly and keeps exact copies of the last ones only: after a trim, "
                "the new last tokens have none, so it would not continue as a cold one. "
                "Build caches with recent_exact=1 where they must be trimmed (speculative "
                "decoding)."
            )


def empty_like(arrays, tokens):
    """Zeroed arrays shaped like ``arrays`` but with ``tokens`` on the token axis."""
    return [mx.zeros((*a.shape[:2], tokens, *a.shape[3:]), a.dtype) for a in arrays]
