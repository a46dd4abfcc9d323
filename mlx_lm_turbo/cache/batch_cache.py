"""Batch forms of the compressed caches, for mlx-lm's ``BatchGenerator`` (the server).

They follow mlx-lm's ``BatchKVCache`` and ``BatchRotatingKVCache``: sequences are
left-padded to a common length, ``offset`` is per sequence, and
``prepare``/``finalize`` move the right padding of a batched prefill to the left.
Every stored array keeps the token axis at 2, so padding, rolling and filtering
act on the compressed data directly: nothing passes through fp16 when sequences
join or leave a batch. Each sequence keeps its own sink tokens and key statistics
(rows of the codec's ``key_mean``), measured on its own first tokens, padding excluded,
under the single caches' rule (see ``TurboQuantKVCache.sink_tokens``).
"""

import os
import sys

import mlx.core as mx
from mlx_lm.models.cache import (
    BatchKVCache,
    BatchRotatingKVCache,
    RotatingKVCache,
    dynamic_roll,
)

from .cache import TurboQuantKVCache, TurboQuantRotatingKVCache
from .common import (
    CacheCommon,
    check_keys_values,
    check_recent_exact,
    empty_like,
    encode,
    led_by_recent,
    new_codec,
)
from .view import TurboKV, remember_causal_padding_mask


def _rows(keep, old, new, neutral):
    """Per row: the old statistic where ``keep``, else the new one. A missing
    statistic is the neutral one (no scaling is a scale of ones)."""
    if old is None and new is None:
        return None
    if old is None or (new is not None and old.shape != new.shape):
        old = neutral(new)
    if new is None:
        new = neutral(old)
    return mx.where(keep, old, new)


def _host_indices(batch_indices):
    return (
        batch_indices.tolist()
        if isinstance(batch_indices, mx.array)
        else list(batch_indices)
    )


def _concat_statistic(codecs, rows, name, neutral):
    present = [
        getattr(c, name)
        for c in codecs
        if c is not None and getattr(c, name) is not None
    ]
    if not present:
        return None
    like = present[0][:1]
    return mx.concatenate(
        [
            getattr(c, name)
            if c is not None and getattr(c, name) is not None
            else mx.broadcast_to(neutral(like), (n, *like.shape[1:]))
            for c, n in zip(codecs, rows)
        ]
    )


class _BatchStatistics(CacheCommon):
    """Per-sequence sink tokens, the key statistics measured on them and the codec they
    live in, shared by both batch forms."""

    def _init_statistics(self, scheme, rows, seed, layer, key_calibration):
        self.scheme, self.seed, self.layer, self.key_calibration = (
            scheme,
            seed,
            layer,
            key_calibration,
        )
        self.codec = None
        # Rows whose statistics exist, kept on the host: checked on every update,
        # so it must not cost a device sync per decode step.
        self.calibrated = [False] * rows
        self._prompt_end = (
            None  # (B,) where each row's real tokens end in a right-padded prefill
        )

    def _init_recent(self, recent_exact):
        # Each row's last recent_exact - 1 tokens, exact, right-aligned with the ring or
        # store (see TurboQuantKVCache.recent); a row's slots before its first token hold
        # padding, which its mask hides.
        self.recent_exact = check_recent_exact(recent_exact)
        self.recent = None

    def _led_by_recent(self, keys, values, width, extra=0):
        """These tokens led by the recent ones kept before them (at most ``width``
        tokens before them in all), to be encoded again with them for their exact
        copies; keep the last recent_exact - 1 (and ``extra`` more, right padding a
        finalize rolls away)."""
        keep = self.recent_exact - 1
        if not keep:
            return keys, values
        recent = self.recent
        if recent is not None:
            recent = tuple(a[:, :, max(a.shape[2] - width, 0) :] for a in recent)
        keys, values, self.recent = led_by_recent(recent, keys, values, keep + extra)
        return keys, values

    def _joined_recent(self, caches, rows, width):
        """The caches' recent copies right-aligned in ``width`` slots (zeros before a
        cache's own), stacked; None if none has any."""
        like = next((c.recent for c in caches if c.recent is not None), None)
        if like is None or width == 0:
            return None
        parts = []
        for c, n in zip(caches, rows):
            for i in range(2):
                own = None if c.recent is None else c.recent[i][:, :, -width:]
                held = 0 if own is None else own.shape[2]
                zeros = mx.zeros(
                    (n, like[i].shape[1], width - held, like[i].shape[3]), like[i].dtype
                )
                parts.append(
                    zeros if own is None else mx.concatenate([zeros, own], axis=2)
                )
        return tuple(mx.concatenate(parts[i::2]) for i in range(2))

    def _init_sinks(self, rows, sink_tokens):
        # Each row's first real tokens, exact (see TurboQuantKVCache.sink_tokens):
        # (B, H, sink_tokens, D) keys and values, of which each row has filled
        # sink_counts[row] (on the host, like ``calibrated``).
        self.sink_tokens = (
            TurboQuantKVCache.sink_tokens if sink_tokens is None else sink_tokens
        )
        self.sinks = None
        self.sink_counts = [0] * rows
        # Their query energies (B, H, sink_tokens, D/2), as the single caches keep them,
        # and per row (host) whether any was not seen.
        self.sink_query_energy = None
        self.sink_queries_missing = [False] * rows

    def _awaits_queries(self):
        S = self.sink_tokens
        return self._wants_query_energy() and any(
            not c and not m and n < S
            for c, m, n in zip(
                self.calibrated, self.sink_queries_missing, self.sink_counts
            )
        )

    @staticmethod
    def _joining(caches):
        """Check the caches can share a batch; end any uncompressed start (it is per sequence)."""
        first = caches[0]
        for c in caches:
            if c.scheme != first.scheme:
                raise ValueError("Caches of different schemes cannot share a batch.")
            if c.sink_tokens != first.sink_tokens:
                raise ValueError(
                    "Caches keeping different numbers of exact first tokens (their "
                    "uncompressed starts) cannot share a batch."
                )
            if c.recent_exact != first.recent_exact:
                raise ValueError(
                    "Caches reading different numbers of recent tokens exactly "
                    "(recent_exact) cannot share a batch."
                )
            c.settle()  # a decode token waiting for its launch joins encoded
            c.compress_now()
        if os.environ.get(
            "MLX_LM_TURBO_LOG_BATCHES"
        ):  # a diagnostic: one line per layer
            print(
                f"[mlx-lm-turbo] batching {len(caches)} sequences in layer {first.layer} "
                f"(cached lengths {[c.offset for c in caches]})",
                file=sys.stderr,
                flush=True,
            )
        return first

    def _adopt_statistics(self, caches, calibrated):
        codecs = [c.codec for c in caches]
        template = next((c for c in codecs if c is not None), None)
        if template is None:
            return
        ones = [1] * len(caches)
        self.codec = template.with_statistics(
            _concat_statistic(codecs, ones, "key_mean", mx.zeros_like),
            _concat_statistic(codecs, ones, "key_scale", mx.ones_like),
        )
        self.calibrated = calibrated

    def _ensure_codec(self, keys, values):
        if self.codec is None:
            self.codec = new_codec(self, keys, values)

    def _set_row_statistics(self, rows, mean, scale):
        """Rows where ``rows`` (host bools) take ``mean``/``scale`` (None: the neutral ones)."""
        keep = mx.array([not r for r in rows])[:, None, None]
        like = self.codec.key_mean if mean is None else mean
        if like is None:
            return
        mean = mx.zeros_like(like) if mean is None else mean
        scale = _rows(keep, self.codec.key_scale, scale, mx.ones_like)
        self.codec = self.codec.with_statistics(
            _rows(keep, self.codec.key_mean, mean, mx.zeros_like), scale
        )

    def _real_tokens(self, n):
        """(B, n) bool: which of an incoming chunk's n tokens are real, not padding."""
        position = self._tokens_seen() + mx.arange(n)
        valid = position[None] >= self.left_padding[:, None]
        if (
            self._prompt_end is not None
        ):  # a right-padded prefill, maybe fed in several chunks
            valid = valid & (position[None] < self._prompt_end[:, None])
        return valid

    def _expect_prompt(self, lengths):
        """A right-padded prefill of ``lengths`` real tokens per row starts now."""
        self._prompt_end = (
            None if lengths is None else mx.array(lengths) + self._tokens_seen()
        )

    def _filter_statistics(self, batch_indices):
        if self.codec is not None and self.codec.key_mean is not None:
            scale = self.codec.key_scale
            self.codec = self.codec.with_statistics(
                self.codec.key_mean[batch_indices],
                None if scale is None else scale[batch_indices],
            )
        rows = _host_indices(batch_indices)
        self.calibrated = [self.calibrated[i] for i in rows]
        self.sink_queries_missing = [self.sink_queries_missing[i] for i in rows]
        if self.sink_query_energy is not None:
            self.sink_query_energy = self.sink_query_energy[batch_indices]

    def _extend_statistics(self, other, my_rows):
        codecs = [self.codec, other.codec]
        template = next((c for c in codecs if c is not None), None)
        if template is not None:
            rows = [my_rows, len(other.calibrated)]
            self.codec = template.with_statistics(
                _concat_statistic(codecs, rows, "key_mean", mx.zeros_like),
                _concat_statistic(codecs, rows, "key_scale", mx.ones_like),
            )
        self.calibrated = self.calibrated + other.calibrated

    # -- sink tokens and the statistics measured on them -------------------------
    def _complete_sinks(self):
        """Per row (host bools): are all its sink tokens there (its statistics measured)?"""
        return [
            bool(self.sink_tokens) and n >= self.sink_tokens for n in self.sink_counts
        ]

    def _calibrate_rows(self):
        """Rows whose sink tokens are all there measure their key statistics on them
        (see TurboQuantKVCache._calibrate)."""
        rows = [
            done and not c for done, c in zip(self._complete_sinks(), self.calibrated)
        ]
        if any(rows):
            missing = self.sink_queries_missing
            energy = None if all(missing) else self.sink_query_energy
            mean, scale = self.codec.key_statistics(
                self.sinks[0], per_row=True, query_energy=energy
            )
            if scale is not None and energy is not None and any(missing):
                scale = mx.where(mx.array(missing)[:, None, None], 1.0, scale)
            self._set_row_statistics(rows, mean, scale)
            self.calibrated = [a or b for a, b in zip(self.calibrated, rows)]

    def _cut_sinks(self, real):
        """After a trim: rows left with fewer ``real`` tokens than sink slots keep fewer,
        and lose the statistics measured on the ones cut."""
        counts = [min(c, r) for c, r in zip(self.sink_counts, real)]
        lost = [
            c and new < old and new < self.sink_tokens
            for c, new, old in zip(self.calibrated, counts, self.sink_counts)
        ]
        self.sink_counts = counts
        if any(lost):
            self._set_row_statistics(lost, None, None)
            self.calibrated = [c and not x for c, x in zip(self.calibrated, lost)]

    def _keep_sinks(self, exact_keys, exact_values, seen=None):
        """Fill each row's sink slots from this chunk's first real tokens; ``seen``
        (host) counts each row's tokens before the chunk (default: its filled slots)."""
        S = self.sink_tokens
        seen = self.sink_counts if seen is None else seen
        if min(seen, default=S) >= S:
            return
        counts = mx.array(self.sink_counts)
        # Slot j of a row takes the (j - seen + 1)-th real token of the chunk.
        rank = mx.cumsum(
            self._real_tokens(exact_keys.shape[2]).astype(mx.int32), axis=1
        )
        wanted = mx.arange(S)[None] - mx.array(seen)[:, None] + 1
        reached = rank[:, None, :] >= wanted[:, :, None]  # (B, S, n)
        fill = (wanted >= 1) & reached.any(axis=2)
        source = mx.argmax(reached, axis=2)[:, None, :, None]
        if self.sinks is None:
            self.sinks = tuple(
                mx.zeros((*a.shape[:2], S, a.shape[3]), a.dtype)
                for a in (exact_keys, exact_values)
            )
        self.sinks = tuple(
            mx.where(fill[:, None, :, None], mx.take_along_axis(a, source, axis=2), old)
            for a, old in zip((exact_keys, exact_values), self.sinks)
        )
        before = self.sink_counts
        # A device sync, but only while some row still lacks its sink tokens.
        self.sink_counts = (counts + fill.sum(axis=1)).tolist()
        if not self.codec.calibrates_on_queries:
            return
        energy = self._incoming_energy(exact_keys.shape[2])
        if energy is None:
            self.sink_queries_missing = [
                m or new > old
                for m, new, old in zip(
                    self.sink_queries_missing, self.sink_counts, before
                )
            ]
            return
        held = self.sink_query_energy
        if held is None:
            held = mx.zeros((*energy.shape[:2], S, energy.shape[3]), energy.dtype)
        self.sink_query_energy = mx.where(
            fill[:, None, :, None], mx.take_along_axis(energy, source, axis=2), held
        )

    def _join_sinks(self, caches, rows):
        """Take the caches' sink (keys, values) and their query energies stacked into
        one batch, every row given all ``sink_tokens`` slots (caches without give
        zeros); None where none has any."""
        self.sinks = self._joined_slots(rows, [c.sinks or (None, None) for c in caches])
        energies = self._joined_slots(rows, [(c.sink_query_energy,) for c in caches])
        self.sink_query_energy = None if energies is None else energies[0]
        self.sink_queries_missing = [
            m
            for c, n in zip(caches, rows)
            for m in (
                c.sink_queries_missing
                if isinstance(c.sink_queries_missing, list)
                else [c.sink_queries_missing] * n
            )
        ]

    def _joined_slots(self, rows, arrays):
        """Each cache's ``arrays`` (a tuple per cache, None entries for none) padded
        to ``sink_tokens`` slots and stacked; None if no cache has any."""
        like = next((a for a in arrays if a[0] is not None), None)
        if like is None:
            return None

        def padded(held, like, n):
            filled = 0 if held is None else held.shape[2]
            zeros = mx.zeros(
                (n, like.shape[1], self.sink_tokens - filled, like.shape[3]), like.dtype
            )
            return zeros if held is None else mx.concatenate([held, zeros], axis=2)

        return tuple(
            mx.concatenate([padded(a[i], like[i], n) for a, n in zip(arrays, rows)])
            for i in range(len(like))
        )

    def _row_sinks(self, idx, cache):
        """Give the single ``cache`` row ``idx``'s sink tokens and query energies."""
        count = self.sink_counts[idx]
        cache.sink_queries_missing = self.sink_queries_missing[idx]
        if not count:
            return
        cache.sinks = tuple(
            mx.contiguous(a[idx : idx + 1, :, :count]) for a in self.sinks
        )
        if self.sink_query_energy is not None and not cache.sink_queries_missing:
            cache.sink_query_energy = mx.contiguous(
                self.sink_query_energy[idx : idx + 1, :, :count]
            )

    def _row_recent(self, idx, tokens):
        """Row ``idx``'s recent copies for a single cache of ``tokens`` tokens, or None."""
        held = min(self.recent_exact - 1, tokens)
        if self.recent is None or held <= 0:
            return None
        return tuple(
            mx.contiguous(a[idx : idx + 1, :, a.shape[2] - held :]) for a in self.recent
        )

    def _row_codec(self, idx):
        scale, mean = self.codec.key_scale, self.codec.key_mean
        if not self.calibrated[idx]:  # a row's neutral statistics are none yet
            return self.codec.with_statistics(None, None)
        return self.codec.with_statistics(
            None if mean is None else mean[idx : idx + 1],
            None if scale is None else scale[idx : idx + 1],
        )


class TurboQuantBatchKVCache(_BatchStatistics):
    """The batch form of ``TurboQuantKVCache`` (mlx-lm's ``BatchKVCache``)."""

    step = 256

    def __init__(
        self,
        scheme,
        left_padding,
        *,
        seed=0,
        layer=0,
        key_calibration=None,
        sink_tokens=None,
        recent_exact=1,
    ):
        self._init_statistics(scheme, len(left_padding), seed, layer, key_calibration)
        self.stored = None
        self._init_sinks(len(left_padding), sink_tokens)
        self._init_recent(recent_exact)
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding = None

    @classmethod
    def merge(cls, caches):
        first = cls._joining(caches)
        lengths = [c.offset for c in caches]
        max_length = max(lengths)
        batch = cls(
            first.scheme,
            [max_length - n for n in lengths],
            seed=first.seed,
            layer=first.layer,
            key_calibration=first.key_calibration,
            sink_tokens=first.sink_tokens,
            recent_exact=first.recent_exact,
        )
        batch._join_sinks(caches, [1] * len(caches))
        batch.recent = batch._joined_recent(
            caches, [1] * len(caches), min(first.recent_exact - 1, max_length)
        )
        batch.sink_counts = [c._sink_count() for c in caches]
        batch._adopt_statistics(caches, batch._complete_sinks())
        arrays = [c._stored_slice() for c in caches]
        like = next((a for a in arrays if a is not None), None)
        if like is None:
            return batch
        rows = []
        for n, a in zip(lengths, arrays):
            pad = empty_like(like, max_length - n)
            rows.append(
                [mx.concatenate([p, x], axis=2) for p, x in zip(pad, a)]
                if a is not None
                else empty_like(like, max_length)
            )
        batch.stored = tuple(mx.concatenate(parts) for parts in zip(*rows))
        batch.offset = batch.offset + max_length
        batch._idx = max_length
        return batch

    def update_and_fetch(self, keys, values):
        check_keys_values(keys, values)
        self._rerun = None  # a view attention did not take queries for: as it is
        self._ensure_codec(keys, values)
        if self._awaits_queries():
            return self._update_awaiting_queries(keys, values)
        self._keep_sinks(keys, values)
        self._calibrate_rows()
        prev, n = self._idx, keys.shape[2]
        extra = 0  # the right padding a finalize rolls away (a sync, only if needed)
        if self._right_padding is not None and self.recent_exact > 1:
            extra = max(self._right_padding.tolist())
        stored, exact_keys, exact_values = encode(
            self.codec, *self._led_by_recent(keys, values, prev, extra), new_tokens=n
        )
        if self.stored is None or prev + n > self.stored[0].shape[2]:
            grown = empty_like(stored, (self.step + n - 1) // self.step * self.step)
            if self.stored is not None:
                grown = [
                    mx.concatenate([s[..., :prev, :], g], axis=2)
                    for s, g in zip(self.stored, grown)
                ]
            self.stored = tuple(grown)
        for s, a in zip(self.stored, stored):
            s[:, :, prev : prev + n] = a
        self.offset = self.offset + n
        self._idx += n
        # Sliced after storing, so the store writes in place (see TurboQuantKVCache).
        attended = tuple(a[:, :, : self._idx] for a in self.stored)
        view = TurboKV(
            self.codec,
            attended,
            exact_keys,
            exact_values,
            self._sink_view(),
            self.recent_exact,
            left_padding=self.left_padding,
        )
        return view, view

    def _sink_view(self):
        """(keys, values, positions) for TurboKV, in the attention domain: slot j of a row
        sits behind its left padding; unfilled slots point at the last position, which the
        exact tail holds."""
        if self.sinks is None:
            return None
        slots = mx.arange(self.sink_tokens)[None]
        positions = mx.where(
            slots < mx.array(self.sink_counts)[:, None],
            self.left_padding[:, None] + slots,
            self._idx - 1,
        )
        return (*self._attention_sinks(), positions[:, None, :, None])

    def make_mask(self, N, return_array=False, **kwargs):
        mask = BatchKVCache.make_mask(self, N, return_array=return_array, **kwargs)
        if not kwargs.get("window_size") and isinstance(mask, mx.array):
            remember_causal_padding_mask(mask)
        return mask

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None):
        if left_padding is not None:
            if self.stored is not None:
                raise ValueError(
                    "Left padding can only be added to an empty batch cache."
                )
            left_padding = mx.array(left_padding)
            self.left_padding = self.left_padding + left_padding
            self.offset = self.offset - left_padding
        if lengths is not None:
            self._expect_prompt(lengths)
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def _tokens_seen(self):
        return self._idx

    def finalize(self):
        self._prompt_end = None
        if self._right_padding is not None:
            padding = self._right_padding
            self.stored = tuple(
                dynamic_roll(a, padding[:, None], axis=2) for a in self.stored
            )
            self.offset = self.offset - padding
            self.left_padding = self.left_padding + padding
            self._right_padding = None
            if self.recent is not None:
                keep = self.recent_exact - 1
                self.recent = tuple(
                    mx.contiguous(
                        dynamic_roll(a, padding[:, None], axis=2)[:, :, -keep:]
                    )
                    for a in self.recent
                )

    def filter(self, batch_indices):
        if self.stored is not None:
            self.stored = tuple(a[batch_indices] for a in self.stored)
        if self.sinks is not None:
            self.sinks = tuple(a[batch_indices] for a in self.sinks)
        if self.recent is not None:
            self.recent = tuple(a[batch_indices] for a in self.recent)
        self._filter_statistics(batch_indices)
        self.sink_counts = [self.sink_counts[i] for i in _host_indices(batch_indices)]
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shift = min(self.left_padding.tolist())
        if shift > 0:
            if self.stored is not None:
                self.stored = tuple(a[..., shift:, :] for a in self.stored)
            self._idx -= shift
            self.left_padding = self.left_padding - shift
            if self.recent is not None:  # padding slots no row needs any more
                self.recent = tuple(
                    a[:, :, max(a.shape[2] - self._idx, 0) :] for a in self.recent
                )

    def extend(self, other):
        idx = max(self._idx, other._idx)
        like = self.stored or other.stored

        def justified(c):
            rows = c.offset.shape[0]
            if like is None:
                return None, c.left_padding
            if c.stored is None:
                arrays = [
                    mx.zeros((rows, a.shape[1], 0, *a.shape[3:]), a.dtype) for a in like
                ]
            else:
                arrays = [a[..., : c._idx, :] for a in c.stored]
            if idx - c._idx:
                arrays = [
                    mx.concatenate([p, a], axis=2)
                    for p, a in zip(empty_like(arrays, idx - c._idx), arrays)
                ]
            return arrays, c.left_padding + (idx - c._idx)

        mine, my_pad = justified(self)
        theirs, their_pad = justified(other)
        if mine is not None:
            self.stored = tuple(mx.concatenate(pair) for pair in zip(mine, theirs))
        self._join_sinks((self, other), (self.offset.shape[0], other.offset.shape[0]))
        self.recent = self._joined_recent(
            (self, other),
            (self.offset.shape[0], other.offset.shape[0]),
            min(self.recent_exact - 1, idx),
        )
        self.sink_counts = self.sink_counts + other.sink_counts
        self._extend_statistics(other, self.offset.shape[0])
        self.left_padding = mx.concatenate([my_pad, their_pad])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx = idx

    def extract(self, idx):
        cache = TurboQuantKVCache(
            self.scheme,
            seed=self.seed,
            layer=self.layer,
            key_calibration=self.key_calibration,
            recent_exact=self.recent_exact,
        )
        cache.sink_tokens = self.sink_tokens
        padding = self.left_padding.tolist()[idx]
        cache.recent = self._row_recent(idx, self._idx - padding)
        if self.stored is not None:
            cache.stored = tuple(
                mx.contiguous(a[idx : idx + 1, :, padding : self._idx])
                for a in self.stored
            )
            cache.codec = self._row_codec(idx)
            cache.offset = self._idx - padding
        self._row_sinks(idx, cache)
        return cache

    def size(self):
        return self._idx

    def empty(self):
        return self.stored is None

    def is_trimmable(self):
        return self.recent_exact == 1

    def trim(self, n):
        self._refuse_trim(n)
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        if any(self.sink_counts):
            self._cut_sinks([max(self._idx - p, 0) for p in self.left_padding.tolist()])
        return n

    @property
    def nbytes(self):
        arrays = (
            *(self.stored or ()),
            *(self.sinks or ()),
            *(() if self.sink_query_energy is None else (self.sink_query_energy,)),
            *(self.recent or ()),
            *self._converted_sink_arrays(),
        )
        return sum(a.nbytes for a in arrays)

    @property
    def state(self):
        return [
            *(self.stored or ()),
            *(self.sinks or ()),
            *(self.recent or ()),
            self.offset,
            self.left_padding,
        ]


# mlx-lm's rotating batch logic moves exactly two arrays (keys, values) of one
# dtype pair: packed rows travel split after their key codes (so the value side is
# never empty); with keys stored as they are, the rows are viewed as the key dtype.
def _pack_pair(codec, stored):
    if codec.scheme.key_bits:
        (rows,) = stored
        return rows[..., : codec.key_words], rows[..., codec.key_words :]
    keys, rows = stored
    return keys, rows.view(keys.dtype)


def _unpack_pair(codec, keys, values):
    if codec.scheme.key_bits:
        return (mx.concatenate([keys, values], axis=-1),)
    return keys, values.view(mx.uint32)


class TurboQuantBatchRotatingKVCache(_BatchStatistics, BatchRotatingKVCache):
    """The batch form of ``TurboQuantRotatingKVCache`` (mlx-lm's ``BatchRotatingKVCache``).

    Each row keeps its sink tokens and measures its statistics on them, and its
    queries read the ones still in their window exactly, as the single cache does.
    Rows differ in which sink tokens their window still holds, and TurboKV has no
    slot for "none" but a position in the exact tail: so a decode step while some
    row still sees a sink token appends its token in temporal order, as a prefill
    chunk does (the newest token last, the exact tail), instead of writing it into
    the ring in place (make_mask matches).
    """

    def __init__(
        self,
        max_size,
        left_padding,
        *,
        scheme=None,
        seed=0,
        layer=0,
        key_calibration=None,
        sink_tokens=None,
        recent_exact=1,
    ):
        BatchRotatingKVCache.__init__(self, max_size, left_padding)
        self._init_statistics(scheme, len(left_padding), seed, layer, key_calibration)
        self._init_sinks(len(left_padding), sink_tokens)
        self._init_recent(recent_exact)
        # Each row's tokens so far (a single cache's offset), on the host: where its
        # sink tokens sit in the window follows from it.
        self.row_tokens = [0] * len(left_padding)

    @property
    def to_quantized(self):  # mlx-lm would swap a cache that has it for an affine one
        raise AttributeError("to_quantized")

    @classmethod
    def merge(cls, caches):
        first = cls._joining(caches)
        # Kept tokens join the batch ring as ordinary ones, as in mlx-lm's batch form.
        shims = []
        for c in caches:
            shim = RotatingKVCache(c.max_size, c.keep)
            if c.stored is not None:
                shim.keys, shim.values = _pack_pair(c.codec, c.stored)
                shim.offset, shim._idx = c.offset, c._idx
            shims.append(shim)
        batch = super().merge(shims)
        batch.scheme, batch.seed, batch.layer = first.scheme, first.seed, first.layer
        batch.key_calibration = first.key_calibration
        batch.sink_tokens = first.sink_tokens
        batch._init_recent(first.recent_exact)
        batch.recent = batch._joined_recent(
            caches,
            [1] * len(caches),
            min(first.recent_exact - 1, batch._temporal_width()),
        )
        batch._join_sinks(caches, [1] * len(caches))
        # A ring with kept slots that has dropped tokens is no longer consecutive
        # once it joins: its sink tokens then count as gone (they were measured).
        batch.sink_counts = [
            0 if c.keep and c.offset > c.size() else c._sink_count() for c in caches
        ]
        batch.row_tokens = [c.offset for c in caches]
        batch._adopt_statistics(
            caches, [c.codec is not None and c.offset >= c.sink_tokens for c in caches]
        )
        return batch

    # -- where the sink tokens are ------------------------------------------------
    def _temporal_width(self):
        """Tokens in the ring once put in temporal order (mlx-lm's _update_concat)."""
        if self.keys is None:
            return 0
        return self.keys.shape[2] if self.rotated else self._idx

    def _decode_sees_sinks(self):
        """Does the next single-token step leave some row a sink token in its window?
        Host state only: make_mask and update_and_fetch ask before the step."""
        width = min(self._temporal_width() + 1, self.max_size)
        for count, seen in zip(self.sink_counts, self.row_tokens):
            count += count == seen < self.sink_tokens  # this token is a sink token
            if count and width - (seen + 1) + count - 1 >= 0:
                return True
        return False

    def _sink_view(self, seen, n, width):
        """TurboKV sinks over a ``width``-token window in temporal order whose last ``n``
        tokens are this chunk, each row right-aligned with ``seen`` tokens before it.
        Slots a row does not hold point at the last position (the exact tail's)."""
        rows, present = [], False
        for count, before in zip(self.sink_counts, seen):
            first = width - n - before  # where the row's token 0 sits (maybe gone)
            held = [t < count and first + t >= 0 for t in range(self.sink_tokens)]
            present = present or any(held)
            rows.append([first + t if h else width - 1 for t, h in enumerate(held)])
        if self.sinks is None or not present:
            return None
        positions = mx.array(rows)[:, None, :, None]
        return (*self._attention_sinks(), positions)

    def _let_go_of_sinks(self):
        """As the single cache does: once every row is past its window and trimming."""
        if self.sinks is not None and all(
            r >= self.max_size + self.sink_tokens for r in self.row_tokens
        ):
            self.sinks, self._converted_sinks = None, None
            self.sink_query_energy = None
            self.sink_counts = [0] * len(self.row_tokens)

    def make_mask(self, N, window_size=None, return_array=False):
        if N > 1 or not self._decode_sees_sinks():
            return BatchRotatingKVCache.make_mask(
                self, N, window_size=window_size, return_array=return_array
            )
        # The step appends in temporal order (see the class doc), trimming the oldest.
        width = self._temporal_width()
        trim = max(0, width + 1 - self.max_size)
        keys = mx.arange(width + 1 - trim)
        mask = keys[None] >= (self.left_padding - trim)[:, None]
        mask = mask & (keys > keys.shape[0] - 1 - (window_size or self.max_size))
        return mask[:, None, None, :]

    def update_and_fetch(self, keys, values):
        check_keys_values(keys, values)
        self._rerun = None  # a view attention did not take queries for: as it is
        self._ensure_codec(keys, values)
        if self._awaits_queries():
            return self._update_awaiting_queries(keys, values)
        n, seen = keys.shape[2], self.row_tokens
        temporal = n > 1 or self._decode_sees_sinks()
        if n > 1 or self._prompt_end is not None:  # count each row's real tokens
            real = self._real_tokens(n).sum(axis=1).tolist()
        else:
            real = [1] * len(seen)
        self._keep_sinks(keys, values, seen)
        self._calibrate_rows()
        # The ring keeps max_size - 1 tokens before the chunk: recent ones beyond are
        # out of every query's window. Single steps: every row's ring holds a token of
        # the same age in the same slot, its recent tokens before the new one, wrapping.
        history = min(self._temporal_width(), self.max_size - 1)
        extra = 0
        if temporal:
            self._roll_recent()
            extra = 0 if self._lengths is None else n
        stored, exact_keys, exact_values = encode(
            self.codec,
            *self._led_by_recent(keys, values, history, extra),
            new_tokens=n,
        )
        packed = _pack_pair(self.codec, stored)
        if temporal:
            ring = BatchRotatingKVCache._update_concat(self, *packed)
        else:
            ring = BatchRotatingKVCache._update_in_place(self, *packed)
        ring = _unpack_pair(self.codec, *ring)
        self.row_tokens = [a + b for a, b in zip(seen, real)]
        window = self.recent_exact
        if temporal:  # history in temporal order, then the chunk
            sinks = self._sink_view(seen, n, ring[0].shape[2])
            view = TurboKV(self.codec, ring, exact_keys, exact_values, sinks, window)
        else:  # the whole ring in ring order, the new token (exact) at _idx - 1
            width, tail = ring[0].shape[2], exact_keys.shape[2]
            at = mx.array(
                [(self._idx - 1 - age) % width for age in range(tail - 1, -1, -1)]
            )
            at = at[None, None, :, None]
            view = TurboKV(
                self.codec, ring, sinks=(exact_keys, exact_values, at), window=window
            )
        self._let_go_of_sinks()
        return view, view

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None):
        if lengths is not None:
            self._expect_prompt(lengths)
        BatchRotatingKVCache.prepare(
            self,
            left_padding=left_padding,
            lengths=lengths,
            right_padding=right_padding,
        )

    def _tokens_seen(self):
        return self._offset

    def _roll_recent(self):
        """As mlx-lm's ring rolls a right-padded prefill's rows (their padding to the
        front, before the next chunk and at finalize), roll their recent copies."""
        if self.recent is not None and self._lengths is not None:
            roll = mx.maximum(0, self.offset - self._lengths)
            keep = self.recent_exact - 1
            self.recent = tuple(
                mx.contiguous(dynamic_roll(a, roll[:, None], axis=2)[:, :, -keep:])
                for a in self.recent
            )

    def finalize(self):
        self._prompt_end = None
        self._roll_recent()
        BatchRotatingKVCache.finalize(self)

    def filter(self, batch_indices):
        BatchRotatingKVCache.filter(self, batch_indices)
        self._filter_statistics(batch_indices)
        rows = _host_indices(batch_indices)
        if self.sinks is not None:
            self.sinks = tuple(a[batch_indices] for a in self.sinks)
        if self.recent is not None:
            self.recent = tuple(a[batch_indices] for a in self.recent)
        self.sink_counts = [self.sink_counts[i] for i in rows]
        self.row_tokens = [self.row_tokens[i] for i in rows]

    def extend(self, other):
        rows = self.offset.shape[0]
        self._join_sinks((self, other), (rows, other.offset.shape[0]))
        idx = max(self._temporal_width(), other._temporal_width())
        self.recent = self._joined_recent(
            (self, other),
            (rows, other.offset.shape[0]),
            min(self.recent_exact - 1, idx),
        )
        BatchRotatingKVCache.extend(self, other)
        self._extend_statistics(other, rows)
        self.sink_counts = self.sink_counts + other.sink_counts
        self.row_tokens = self.row_tokens + other.row_tokens

    def extract(self, idx):
        plain = BatchRotatingKVCache.extract(self, idx)
        cache = TurboQuantRotatingKVCache(
            self.scheme,
            self.max_size,
            0,
            seed=self.seed,
            layer=self.layer,
            key_calibration=self.key_calibration,
            recent_exact=self.recent_exact,
        )
        cache.sink_tokens = self.sink_tokens
        cache.recent = self._row_recent(idx, self.row_tokens[idx])
        if self.keys is not None:
            cache.stored = tuple(
                mx.contiguous(a)
                for a in _unpack_pair(self.codec, plain.keys, plain.values)
            )
            cache.codec = self._row_codec(idx)
            cache.offset, cache._idx = plain.offset, plain._idx
        self._row_sinks(idx, cache)
        cache._let_go_of_sinks()
        return cache

    def is_trimmable(self):
        return BatchRotatingKVCache.is_trimmable(self) and self.recent_exact == 1

    def trim(self, n):
        self._refuse_trim(n)
        n = BatchRotatingKVCache.trim(self, n)
        self.row_tokens = [max(r - n, 0) for r in self.row_tokens]
        if any(self.sink_counts):
            self._cut_sinks(self.row_tokens)
        return n

    @property
    def nbytes(self):
        arrays = (
            *(self.sinks or ()),
            *(() if self.sink_query_energy is None else (self.sink_query_energy,)),
            *(self.recent or ()),
            *self._converted_sink_arrays(),
        )
        return BatchRotatingKVCache.nbytes.fget(self) + sum(a.nbytes for a in arrays)
