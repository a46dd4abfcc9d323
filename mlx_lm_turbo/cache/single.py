"""What the single caches share: ``SingleCache``, the base of ``TurboQuantKVCache``
(kv_cache.py) and ``TurboQuantRotatingKVCache`` (rotating_cache.py), and the format of
their saved state.

Both persist only TurboQuant-compressed data: each update compresses the incoming chunk
at once, and ``update_and_fetch`` returns a ``TurboKV`` (the compressed history plus
the exact keys and values of the chunk and of the ``recent_exact - 1`` tokens before
it; at a decode step the fused kernels serve, the token as the model gave it and those
tokens as rows for the launch, see ``TurboQuantKVCache``) that
``attention.turbo_scaled_dot_product_attention`` consumes. So during a chunked prefill
the cache never holds more than one chunk (and those recent tokens) in fp16.

Neither class has ``bits`` or ``to_quantized``: mlx-lm would route the first to
its affine quantized attention and replace a cache that has the second.
"""

import json
from functools import lru_cache

import mlx.core as mx

from ..codec.codec import TurboCodec, check_key_calibration
from ..codec.schemes import parse_scheme
from ..compat import check_mlx_lm_version
from ..errors import CacheFormatError
from .common import (
    SINK_TOKENS,
    CacheCommon,
    check_integer,
    check_keys_values,
    check_recent_exact,
    encode,
    led_by_recent,
    new_codec,
)
from .view import TurboKV

# The layout of a saved cache's state and the rules it was made under, written into its
# metadata. 0: release 0.1.0 (no "format" key), refused by check_format; 1: 16 sink tokens
# as the model gave them, key statistics measured on them, each query reading only itself
# and the sink tokens exactly, rotation signs named in the codec's metadata; sliding-window
# caches without sink tokens, their statistics measured on the first chunk compressed
# (refused by check_format); 2: sliding-window caches follow format 1's rule too (sink
# tokens read exactly while in the window); 3: format 2's rules, a token's compressed key
# and value in one row (codec.join_rows; formats 1-2 kept four arrays, joined on load);
# 4: format 3's, each query also reading the recent_exact - 1 tokens before it exactly
# (exact copies of them after the sink arrays in the state; formats 1-3 continue with
# recent_exact 1, as they were saved); 5: format 4's, the sink tokens' query energies
# after the recent copies (center+query calibrates on them; formats 1-4 knew no such
# calibration and continue without).
# Change the layout or the rules, bump this, and say in check_format what older ones
# become.
FORMAT_VERSION = 5
_SAVED_KEYS = (
    "scheme",
    "seed",
    "layer",
    "uncompressed_start",
    "key_calibration",
    "sink_tokens",
    "offset",
    "codec",
)


def check_format(meta: dict) -> int:
    """The format version of a saved cache's metadata, or CacheFormatError saying why
    this version cannot continue it exactly."""
    version = meta.get("format", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CacheFormatError(
            f"This prompt cache was saved in format {version!r} by a newer mlx-lm-turbo; this one reads "
            f"formats up to {FORMAT_VERSION}. Upgrade mlx-lm-turbo or re-create the cache."
        )
    missing = [k for k in _SAVED_KEYS if k not in meta]
    if missing:
        raise CacheFormatError(
            f"This prompt cache lacks {', '.join(missing)} (saved before mlx-lm-turbo 0.1.0?); "
            "re-create it with this version."
        )
    if version == 0:
        raise CacheFormatError(
            "This prompt cache was saved by mlx-lm-turbo 0.1.0, which compressed under other rules "
            "(4 sink tokens, key statistics from the first chunk, each chunk reading itself exactly, "
            "rotation signs from NumPy's generator): this version cannot continue it as 0.1.0 did. "
            "Re-create it with this version (mlx_lm.cache_prompt)."
        )
    if version >= 4 and "recent_exact" not in meta:
        raise CacheFormatError(
            f"This prompt cache (format {version}) lacks recent_exact; re-create it with "
            "this version."
        )
    if version >= 5 and "sink_queries_missing" not in meta:
        raise CacheFormatError(
            f"This prompt cache (format {version}) lacks sink_queries_missing; re-create "
            "it with this version."
        )
    if version == 1 and "max_size" in meta:
        raise CacheFormatError(
            "This prompt cache's sliding-window layers were saved by an mlx-lm-turbo that "
            "measured their key statistics on the first chunk and kept no sink tokens: this "
            "version cannot continue them as it did. Re-create the cache with this version "
            "(mlx_lm.cache_prompt)."
        )
    return version


@lru_cache(maxsize=None)
def _leading_positions(n):
    """Positions of a sequence's first n tokens, (1, 1, n, 1): made once, not per step
    (and evaluated at once, so no thread's stream is tied to it)."""
    positions = mx.arange(n)[None, None, :, None]
    mx.eval(positions)
    return positions


class SingleCache(CacheCommon):
    """What both cache layouts share: the codec, the fp16 start, sink tokens, state, sizes."""

    step = 256
    sink_tokens = SINK_TOKENS  # measured in _calibrate

    def __init__(
        self,
        scheme,
        *,
        seed=0,
        layer=0,
        uncompressed_start=0,
        key_calibration=None,
        recent_exact=1,
    ):
        self.scheme = parse_scheme(scheme)
        if self.scheme is None:
            raise ValueError(
                "A TurboQuant cache needs a scheme such as 'turbo4', not 'none'."
            )
        self.seed = check_integer("seed", seed)
        self.layer = check_integer("layer", layer)
        self.uncompressed_start = check_integer(
            "uncompressed_start", uncompressed_start
        )
        # Queries before the uncompressed start read every key exactly; those tokens
        # are kept exact for good, so every later query reads them exactly too, however
        # the prompt was chunked (see _compressing).
        self.sink_tokens = max(type(self).sink_tokens, uncompressed_start)
        self.key_calibration = check_key_calibration(key_calibration)
        # Each query reads itself and the recent_exact - 1 tokens before it exactly
        # (TurboKV.window), every other key but the sink tokens compressed: ``recent``
        # keeps exact copies of the last recent_exact - 1 tokens, as the model gave
        # them, so the rule holds whatever the chunking or a reused prefix.
        self.recent_exact = check_recent_exact(recent_exact)
        self.recent = None
        self.offset = 0
        self.codec = None  # built when compression starts
        self.stored = None  # compressed arrays, token axis 2
        self.uncompressed = (
            None  # mlx-lm cache holding the tokens before compression starts
        )
        self.sinks = (
            None  # exact (keys, values) of the first tokens, as the model gave them
        )
        # Their codec.query_energy, (1, H, n, D/2), for center+query; missing if
        # any sink token's queries were not seen: its calibration then only centres.
        # An uncompressed start's queries go through mlx-lm's attention, unseen.
        self.sink_query_energy = None
        self.sink_queries_missing = uncompressed_start > 0

    # -- the uncompressed start and the switch to compression ---------------
    def _make_uncompressed(self):
        raise NotImplementedError

    def _uncompressed_history(self):
        """The uncompressed cache's keys and values in temporal order."""
        raise NotImplementedError

    def _compressing(self, keys, values):
        """Route an update: True when it goes to the compressed store."""
        check_keys_values(keys, values)
        if self.codec is not None:
            if (
                keys.shape[1] != self.codec.n_kv_heads
                or keys.shape[3] != self.codec.key_dim
                or values.shape[3] != self.codec.value_dim
            ):
                raise ValueError(
                    f"Keys {keys.shape} / values {values.shape} do not match this cache's "
                    f"{self.codec.n_kv_heads} heads of dims {self.codec.key_dim}/{self.codec.value_dim}."
                )
            return True
        # The uncompressed start: a chunk after which the cache still holds fewer than
        # uncompressed_start tokens stays uncompressed (its queries read every key
        # exactly, through mlx-lm's attention); the chunk that reaches it compresses the
        # history and itself, and the one rule holds from then on. The first
        # uncompressed_start tokens are sink tokens (__init__), so a query before it
        # reads every key exactly on either side of that switch: where the chunk that
        # reaches it starts (the prefill step, a reused prefix) changes nothing.
        if self.offset + keys.shape[2] < self._uncompressed_end():
            if self.uncompressed is None:
                self.uncompressed = self._make_uncompressed()
            return False
        self._start_compression(keys, values)
        return True

    def _uncompressed_end(self):
        """The cache compresses once a chunk would take it to this many tokens."""
        return self.uncompressed_start

    def _start_compression(self, incoming_keys=None, incoming_values=None):
        """Build the codec and compress the uncompressed history."""
        history = (
            self._uncompressed_history() if self.uncompressed is not None else None
        )
        keys = incoming_keys if incoming_keys is not None else history[0]
        values = incoming_values if incoming_values is not None else history[1]
        self.codec = new_codec(self, keys, values)
        self.uncompressed = None
        if history is not None:
            self._store_history(
                self._encode(*history, self.offset - history[0].shape[2])[0]
            )

    def _calibrate(self):
        """Measure the key statistics on the sink tokens once all are there. A copy of the
        codec: deep-copied caches (a prompt cache's entries) share it."""
        if (
            self.sink_tokens
            and self.codec.key_calibration != "none"
            and self.codec.key_mean is None
            and self.codec.key_scale is None
            and self._sink_count() == self.sink_tokens
        ):
            energy = None if self.sink_queries_missing else self.sink_query_energy
            self.codec = self.codec.with_statistics(
                *self.codec.key_statistics(self.sinks[0], query_energy=energy)
            )

    def _encode(self, keys, values, start):
        """Keep the sink tokens among these (the first at position ``start``), calibrate
        once they are all there, compress: (stored arrays, the exact tail's keys and
        values: the recent tokens before these, then these, in the attention domain)."""
        self._keep_sinks(keys, values, start)
        self._calibrate()
        return encode(
            self.codec, *self._led_by_recent(keys, values), new_tokens=keys.shape[2]
        )

    def _led_by_recent(self, keys, values):
        """These tokens led by the recent tokens kept before them, as the model gave
        them (encoded again with these for their exact copies in the current codec's
        domain); keep the last recent_exact - 1 of them all."""
        keep = self.recent_exact - 1
        if not keep:
            return keys, values
        keys, values, self.recent = led_by_recent(self.recent, keys, values, keep)
        return keys, values

    def _sink_count(self):
        return 0 if self.sinks is None else self.sinks[0].shape[2]

    def _keep_sinks(self, keys, values, start):
        """Keep the K/V of a chunk's tokens (the first at position ``start``) that are
        among the first ``sink_tokens`` and not kept yet. None past a gap: a sliding
        window lets its sinks go once no query can see them (after measuring them)."""
        count = self._sink_count()
        if count == self.sink_tokens:  # all kept: every decode step after the first few
            return
        skip = count - start
        take = min(self.sink_tokens - count, keys.shape[2] - skip)
        if skip < 0 or take <= 0:
            return
        # Copies: a slice would keep the whole chunk's K/V alive with it.
        new = tuple(mx.contiguous(a[:, :, skip : skip + take]) for a in (keys, values))
        self.sinks = (
            new
            if self.sinks is None
            else tuple(mx.concatenate([s, a], axis=2) for s, a in zip(self.sinks, new))
        )
        if self.codec.calibrates_on_queries and not self.sink_queries_missing:
            energy = self._incoming_energy(keys.shape[2])
            if energy is None:
                self.sink_queries_missing, self.sink_query_energy = True, None
            else:
                energy = mx.contiguous(energy[:, :, skip : skip + take])
                held = self.sink_query_energy
                self.sink_query_energy = (
                    energy if held is None else mx.concatenate([held, energy], axis=2)
                )

    def _sinks_in(self, width):
        """The sink tokens as TurboKV sinks over ``width`` stored tokens, or None."""
        if self.sinks is None:
            return None
        # One sequence: its first tokens lead the cache.
        return (*self._attention_sinks(), _leading_positions(self._sink_count()))

    def _view(self, stored, exact_keys=None, exact_values=None, exact_at=None):
        """The TurboKV over ``stored``; ``exact_at`` (ring indices) places exact tokens
        that are not last (a sliding window's newest and the recent ones before it),
        given as sinks unless they are sink tokens (which the sinks hold already)."""
        sinks = self._sinks_in(stored[0].shape[2])
        if exact_at is not None:
            first = self.offset - len(exact_at)  # position of the first of them
            skip = max(0, min(self._sink_count() - first, len(exact_at)))
            if skip < len(exact_at):
                held = (
                    exact_keys[:, :, skip:],
                    exact_values[:, :, skip:],
                    mx.array(exact_at[skip:])[None, None, :, None],
                )
                sinks = (
                    held
                    if sinks is None
                    else tuple(mx.concatenate(p, axis=2) for p in zip(sinks, held))
                )
            exact_keys = exact_values = None
        return TurboKV(
            self.codec, stored, exact_keys, exact_values, sinks, self.recent_exact
        )

    def compress_now(self):
        """End the uncompressed start early (a sequence joining a batch is compressed)."""
        if self.uncompressed is not None:
            self._start_compression()

    # -- mlx-lm's cache contract ---------------------------------------------
    def empty(self):
        return self.stored is None and self.uncompressed is None

    def size(self):
        return self.offset

    def is_trimmable(self):
        # A trim would leave the last tokens without the exact copies a cold prefill
        # reads them with: a cache keeping recent copies cannot be trimmed exactly.
        return self.recent_exact == 1

    # A pipeline stage ties its send into the graph through its last cache:
    # ``cache[-1].keys = mx.depends(cache[-1].keys, h)`` (mlx-lm's pipelined models).
    @property
    def keys(self):
        if self.stored is None and self.uncompressed is None:
            raise AttributeError("an empty TurboQuant cache holds no keys")
        if self.stored is None:
            return self.uncompressed.keys
        self._share_buffers()
        return self.stored[0]

    @keys.setter
    def keys(self, value):
        if self.stored is not None:
            self._share_buffers()
            self.stored = (value, *self.stored[1:])
        else:
            self.uncompressed.keys = value

    def trim(self, n):
        if self.uncompressed is not None:
            n = self.uncompressed.trim(n)
            self.offset = self.uncompressed.offset
            return n
        self._refuse_trim(n)
        self.settle()
        n = min(self.offset, n)
        self.offset -= n
        if self._sink_count() > self.offset:
            self.sinks = (
                tuple(a[:, :, : self.offset] for a in self.sinks)
                if self.offset
                else None
            )
            if self.sink_query_energy is not None:
                self.sink_query_energy = (
                    self.sink_query_energy[:, :, : self.offset] if self.offset else None
                )
            if (
                self.codec is not None and self.sink_tokens
            ):  # measured on sinks no longer all there
                self.codec = self.codec.with_statistics(None, None)
        return n

    @property
    def nbytes(self):
        arrays = (
            list(self.stored or ())
            + list(self.sinks or ())
            + [a for a in (self.sink_query_energy,) if a is not None]
            + self._recent_arrays()
            + self._converted_sink_arrays()
        )
        if self.codec is not None:
            arrays += [
                a for a in (self.codec.key_mean, self.codec.key_scale) if a is not None
            ]
        total = sum(a.nbytes for a in arrays)
        return total + (
            self.uncompressed.nbytes if self.uncompressed is not None else 0
        )

    def _recent_arrays(self):
        return list(self.recent or ())

    def _extra_meta(self):
        return {}

    @property
    def meta_state(self):
        meta = {
            "format": FORMAT_VERSION,
            "scheme": self.scheme.name,
            "seed": self.seed,
            "layer": self.layer,
            "uncompressed_start": self.uncompressed_start,
            "key_calibration": self.key_calibration,
            "sink_tokens": self.sink_tokens,
            "recent_exact": self.recent_exact,
            "sink_queries_missing": self.sink_queries_missing,
            "offset": self.offset,
            "codec": self.codec.meta() if self.codec else None,
            **self._extra_meta(),
        }
        return (json.dumps(meta),)

    @meta_state.setter
    def meta_state(self, v):
        meta = json.loads(v[0])
        self._format = check_format(meta)
        self.scheme = parse_scheme(meta["scheme"])
        self.seed, self.layer = meta["seed"], meta["layer"]
        self.uncompressed_start = meta["uncompressed_start"]
        self.key_calibration = meta["key_calibration"]
        self.sink_tokens, self.offset = meta["sink_tokens"], meta["offset"]
        # Formats 1-3 read only the query itself exactly besides the sink tokens.
        self.recent_exact = meta.get("recent_exact", 1)
        # Formats 1-4 kept no query energies.
        self.sink_queries_missing = meta.get("sink_queries_missing", True)
        self._set_extra_meta(meta)
        self._codec_meta = meta["codec"]

    def _set_extra_meta(self, meta):
        pass

    def _update_compressed(self, stored, exact_keys, exact_values) -> TurboKV:
        raise NotImplementedError

    def update_and_fetch(self, keys, values):
        self._rerun = None  # a view attention did not take queries for: as it is
        if not self._compressing(keys, values):
            out = self.uncompressed.update_and_fetch(keys, values)
            self.offset = self.uncompressed.offset
            return out
        if self._awaits_queries():
            return self._update_awaiting_queries(keys, values)
        view = self._update_compressed(*self._encode(keys, values, self.offset))
        return view, view

    def _awaits_queries(self):
        return (
            self._wants_query_energy()
            and self.codec.key_mean is None
            and not self.sink_queries_missing
            and self._sink_count() < self.sink_tokens
        )

    def settle(self):
        """Nothing to do but in ``TurboQuantKVCache``, whose decode token may wait for
        its attention launch to be encoded, and whose launches write rows MLX does not
        know of."""

    def _share_buffers(self):
        """Others now hold the stored arrays whole (only ``TurboQuantKVCache`` minds)."""

    def _stored_slice(self):
        """The stored arrays without unused capacity (every token encoded first)."""
        self.settle()
        return self._slice()

    def _slice(self):
        stored, n = self.stored, self.offset
        if stored is None or n >= stored[0].shape[2]:
            return stored
        return tuple([a[:, :, :n] for a in stored])

    @property
    def state(self):
        """[meta json, key mean, key scale, sink keys, sink values, recent keys, recent
        values, sink query energy, *arrays]: flat, so a saved file round-trips (formats
        1-3 had no recent copies, 1-4 no query energies)."""
        if self.codec is not None:
            arrays = list(self._stored_slice() or ())
            mean, scale = self.codec.key_mean, self.codec.key_scale
        elif self.uncompressed is not None:
            arrays, mean, scale = list(self.uncompressed.state), None, None
        else:
            arrays, mean, scale = [], None, None
        sink_keys, sink_values = self.sinks or (None, None)
        recent_keys, recent_values = self.recent or (None, None)
        return [
            self.meta_state[0],
            *(mean, scale, sink_keys, sink_values, recent_keys, recent_values),
            self.sink_query_energy,
            *arrays,
        ]

    @state.setter
    def state(self, v):
        self._share_buffers()  # the new arrays come from outside
        meta, mean, scale, sink_keys, sink_values, *arrays = v
        self.meta_state = (meta,)
        recent_keys = recent_values = None
        if self._format >= 4:
            recent_keys, recent_values, *arrays = arrays
        self.sink_query_energy = None
        if self._format >= 5:
            self.sink_query_energy, *arrays = arrays
        self.codec, self.stored, self.uncompressed = None, None, None
        self.sinks = None if sink_keys is None else (sink_keys, sink_values)
        self.recent = None if recent_keys is None else (recent_keys, recent_values)
        if self._codec_meta is not None:  # compressed
            check_mlx_lm_version()
            self.codec = TurboCodec.from_meta(self._codec_meta, mean, scale)
            if arrays and self._format < 3:
                arrays = self.codec.stored_from_arrays(arrays)
            self.stored = tuple(arrays) if arrays else None
        elif arrays:
            self.uncompressed = type(self._make_uncompressed()).from_state(arrays)
        del self._codec_meta, self._format

    @classmethod
    def from_state(cls, state):
        cache = cls.__new__(cls)
        cache.state = state
        return cache
