"""What the batch forms of the compressed caches share: ``BatchCache``, the base of
``TurboQuantBatchKVCache`` (kv_cache.py) and ``TurboQuantBatchRotatingKVCache``
(rotating_cache.py), for mlx-lm's ``BatchGenerator`` (the server).

They follow mlx-lm's ``BatchKVCache`` and ``BatchRotatingKVCache``: sequences are
left-padded to a common length, ``offset`` is per sequence, and
``prepare``/``finalize`` move the right padding of a batched prefill to the left.
Every stored array keeps the token axis at 2, so padding, rolling and filtering
act on the compressed data directly: nothing passes through fp16 when sequences
join or leave a batch. Each sequence keeps its own sink tokens and key statistics
(rows of the codec's ``key_mean``), measured on its own first tokens, padding excluded,
under the single caches' rule (``SINK_TOKENS``).
"""

import os
import sys

import mlx.core as mx

from .common import (
    SINK_TOKENS,
    CacheCommon,
    check_recent_exact,
    led_by_recent,
    new_codec,
)


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


def host_indices(batch_indices):
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


class BatchCache(CacheCommon):
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
        # Each row's first real tokens, exact (see SINK_TOKENS):
        # (B, H, sink_tokens, D) keys and values, of which each row has filled
        # sink_counts[row] (on the host, like ``calibrated``).
        self.sink_tokens = SINK_TOKENS if sink_tokens is None else sink_tokens
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
        rows = host_indices(batch_indices)
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

    def _row_options(self):
        """The options a row's single cache (``extract``) is made with."""
        return dict(
            seed=self.seed,
            layer=self.layer,
            key_calibration=self.key_calibration,
            recent_exact=self.recent_exact,
        )

    def _held_nbytes(self):
        """Bytes of what the cache holds besides its stored tokens: sink tokens and
        their query energy, recent copies, converted sinks."""
        arrays = (
            *(self.sinks or ()),
            *(() if self.sink_query_energy is None else (self.sink_query_energy,)),
            *(self.recent or ()),
            *self._converted_sink_arrays(),
        )
        return sum(a.nbytes for a in arrays)

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
