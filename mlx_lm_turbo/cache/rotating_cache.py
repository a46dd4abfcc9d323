"""``TurboQuantRotatingKVCache`` replaces mlx-lm's ``RotatingKVCache`` (sliding windows)
and ``TurboQuantBatchRotatingKVCache`` its ``BatchRotatingKVCache``: in one module, as
mlx-lm keeps them (a single cache's ``merge`` builds the batch form, whose ``extract``
gives single caches back)."""

import mlx.core as mx
from mlx_lm.models.cache import BatchRotatingKVCache, RotatingKVCache, dynamic_roll

from .batch import BatchCache, host_indices
from .common import check_keys_values, empty_like, encode
from .single import SingleCache
from .view import TurboKV


class TurboQuantRotatingKVCache(SingleCache):
    """Compressed replacement for mlx-lm's ``RotatingKVCache`` (sliding windows).

    Same ring-buffer semantics (``max_size``, ``keep``, temporal order on
    multi-token updates, in-place rotation on single tokens), applied to the
    compressed arrays; the array-generic helpers are mlx-lm's own.

    The rule of the full caches holds here too: the key statistics are measured on
    the first ``sink_tokens`` tokens, and each query reads itself and those of them
    still in its window exactly, every other key compressed. Once no query can see
    them any more (and no trim can bring them back), they are let go.
    """

    def __init__(self, scheme, max_size, keep=0, **kwargs):
        super().__init__(scheme, **kwargs)
        self.max_size, self.keep = max_size, keep
        self._idx = 0

    def _uncompressed_end(self):
        # A window's uncompressed start ends, at the latest, before its ring lets its
        # first token go: the sink tokens are taken from the history when it ends.
        return min(self.uncompressed_start, self.max_size + 1)

    def _sinks_in(self, width):
        """The sink tokens the ring's ``width`` slots hold, at their ring indices: kept
        slots hold the first ``keep`` tokens; the newest token sits at ``_idx - 1``
        and older ones before it, wrapping within [keep, width) (also in temporal
        order, where ``_idx`` is the width)."""
        if self.sinks is None:
            return None
        region = width - self.keep
        present, positions = [], []
        for t in range(self._sink_count()):
            age = self.offset - 1 - t
            if t < self.keep:
                present.append(t), positions.append(t)
            elif age < region:
                present.append(t)
                positions.append(self.keep + (self._idx - 1 - self.keep - age) % region)
        if not present:
            return None
        keys, values = self._attention_sinks()
        if len(present) < self._sink_count():
            index = mx.array(present)
            keys, values = (mx.take(a, index, axis=2) for a in (keys, values))
        return keys, values, mx.array(positions)[None, None, :, None]

    def _let_go_of_sinks(self):
        """Drop the sink tokens once no later query can see them: past the window
        (nothing kept) and past trimming (is_trimmable), so measured long ago."""
        if (
            self.sinks is not None
            and self.keep == 0
            and self.offset >= self.max_size + self.sink_tokens
        ):
            self.sinks, self._converted_sinks = None, None
            self.sink_query_energy = None

    _temporal_order = RotatingKVCache._temporal_order
    _trim = RotatingKVCache._trim

    def _make_uncompressed(self):
        return RotatingKVCache(self.max_size, self.keep)

    def _uncompressed_history(self):
        u = self.uncompressed
        return u._temporal_order(u.keys), u._temporal_order(u.values)

    def _store_history(self, new):
        # The uncompressed ring's contents, in temporal order; offset is unchanged.
        self.stored, self._idx = tuple(new), new[0].shape[2]

    def _update_concat(self, new):
        """Append a multi-token chunk; the stored arrays to attend to."""
        if self.stored is None:
            self.stored = tuple(new)
        else:
            ordered = [self._temporal_order(a) for a in self.stored]
            self._idx = ordered[0].shape[2]
            # Keep max_size - 1 old tokens so every new token sees a full window.
            trim_size = self._idx - self.max_size + 1
            history = tuple(self._trim(trim_size, a) for a in ordered)
            self.stored = tuple(
                mx.concatenate([h, a], axis=2) for h, a in zip(history, new)
            )
        self.offset += new[0].shape[2]
        self._idx = self.stored[0].shape[2]
        return self.stored

    def _update_in_place(self, new):
        n, prev = new[0].shape[2], self.offset
        capacity = self.stored[0].shape[2] if self.stored is not None else 0
        if self.stored is None or (prev >= capacity and capacity < self.max_size):
            grown = empty_like(new, min(self.step, self.max_size - prev))
            if self.stored is not None:
                grown = [
                    mx.concatenate([s, g], axis=2) for s, g in zip(self.stored, grown)
                ]
            self.stored, self._idx = tuple(grown), prev
        trim_size = self.stored[0].shape[2] - self.max_size
        if trim_size > 0:
            self.stored = tuple(self._trim(trim_size, a) for a in self.stored)
            self._idx = self.max_size
        if self._idx == self.max_size:
            self._idx = self.keep
        for s, a in zip(self.stored, new):
            s[:, :, self._idx : self._idx + n] = a
        self.offset += n
        self._idx += n
        return self._stored_slice()

    def _update_compressed(self, stored, exact_keys, exact_values):
        n = stored[0].shape[2]
        if n == 1:
            # Like RotatingKVCache: the whole ring in ring order, new token included;
            # the exact tail (the recent tokens, then it) sits before _idx, wrapping
            # within the ring's unkept slots.
            ring = self._update_in_place(stored)
            region = ring[0].shape[2] - self.keep
            tail = min(exact_keys.shape[2], region)
            at = [
                self.keep + (self._idx - 1 - self.keep - age) % region
                for age in range(tail - 1, -1, -1)
            ]
            exact_keys, exact_values = (
                a[:, :, -tail:] for a in (exact_keys, exact_values)
            )
            view = self._view(ring, exact_keys, exact_values, exact_at=at)
        else:
            ring = self._update_concat(stored)
            # The tail must be the window's last tokens in order: the recent ones still
            # there after the kept slots (a ring that dropped tokens holds, after its
            # kept ones, only its last ones).
            history = ring[0].shape[2] - n
            consecutive = history if self.offset - n <= history else history - self.keep
            recent = min(exact_keys.shape[2] - n, max(consecutive, 0))
            exact_keys, exact_values = (
                a[:, :, a.shape[2] - n - recent :] for a in (exact_keys, exact_values)
            )
            view = self._view(ring, exact_keys, exact_values)
        self._let_go_of_sinks()
        return view

    def size(self):
        return min(self.offset, self.max_size)

    def is_trimmable(self):
        return self.offset < self.max_size and super().is_trimmable()

    def trim(self, n):
        trimmed = super().trim(n)
        if self.uncompressed is None:
            self._idx -= trimmed
        return trimmed

    @classmethod
    def merge(cls, caches):
        """Join single caches into one batch cache (mlx-lm's server batches through this)."""
        return TurboQuantBatchRotatingKVCache.merge(caches)

    def make_mask(self, N, window_size=None, return_array=False):
        source = self.uncompressed if self.uncompressed is not None else self
        return RotatingKVCache.make_mask(
            source, N, window_size=window_size, return_array=return_array
        )

    def _extra_meta(self):
        return {"max_size": self.max_size, "keep": self.keep, "idx": self._idx}

    def _set_extra_meta(self, meta):
        self.max_size, self.keep, self._idx = (
            meta["max_size"],
            meta["keep"],
            meta["idx"],
        )


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


class TurboQuantBatchRotatingKVCache(BatchCache, BatchRotatingKVCache):
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
        rows = host_indices(batch_indices)
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
            self.scheme, self.max_size, 0, **self._row_options()
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
        return BatchRotatingKVCache.nbytes.fget(self) + self._held_nbytes()
