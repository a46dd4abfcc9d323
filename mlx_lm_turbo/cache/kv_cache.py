"""``TurboQuantKVCache`` replaces mlx-lm's ``KVCache`` and ``TurboQuantBatchKVCache``
its ``BatchKVCache``: in one module, as mlx-lm keeps them (a single cache's ``merge``
builds the batch form, whose ``extract`` gives single caches back)."""

import copy

import mlx.core as mx
from mlx_lm.models.cache import (
    BatchKVCache,
    KVCache,
    create_attention_mask,
    dynamic_roll,
)

from ..kernels.decode_attention import (
    raw_tail_support,
    recent_tail,
    tail_row,
    tail_rows,
)
from .batch import BatchCache, host_indices
from .common import check_keys_values, empty_like, encode
from .single import SingleCache
from .view import PendingStep, TurboKV, recent_part, remember_causal_padding_mask


class TurboQuantKVCache(SingleCache):
    """Compressed replacement for mlx-lm's ``KVCache``.

    A decode token whose layer the fused kernels serve is not encoded here: the view
    carries it as the model gave it (``TurboKV.pending``, a ``PendingStep``) and the
    attention launch encodes it too, its row stored on the cache's next call
    (``_take_launch``): on MLX-CUDA each custom call costs the host more than the
    encoding's GPU time. Anything else that reads the cache first has it encoded as a
    plain update would (``settle``).

    Where no one else can hold the token's slot, the launch writes the row there itself:
    no update op, which on MLX-CUDA would also copy the layer's whole cache while the
    previous step still runs. MLX knows nothing of that write; the layer's next launch
    is ordered after it (its ``previous`` input), anything else reads the cache after
    ``_order_rows`` has written the last such row again through an op.
    """

    # The view whose decode token (its ``pending`` step) waits for its launch, or for
    # its launch's row to be stored
    _waiting = None
    # (position, rows) of the last row a launch wrote into its slot, not yet by an op
    # (its own, or a recent tail led by it)
    _rows_in_place = None
    # The first slot of the stored buffers that no one else can hold (None: no slot):
    # 0 when they grow into new ones, raised by every slice of them handed out, None
    # once they are handed out or in whole (a state, ``keys``, a copy of the cache).
    _private_from = None
    # (codec, tail): the recent tokens as a launch reads them (_recent_rows_now), or
    # None. While they are held, ``recent`` is views of them, made when asked for (not
    # at every step: each slice costs the host microseconds); setting ``recent``
    # drops them.
    _recent_rows = None

    @property
    def recent(self):
        self._take_launch()
        if self._recent is None and self._recent_rows is not None:
            codec, tail = self._recent_rows
            rows, D = tail_rows(codec, tail), codec.key_dim
            self._recent = (recent_part(rows, 2, D), recent_part(rows, 3, D))
        return self._recent

    @recent.setter
    def recent(self, value):
        self._recent, self._recent_rows = value, None

    def _make_uncompressed(self):
        return KVCache()

    def _uncompressed_history(self):
        return self.uncompressed.keys_and_values()

    def _store_history(self, new):
        self.offset = 0
        self._store(new)

    def _store(self, new):
        """Append compressed arrays at ``offset``, growing capacity in steps."""
        prev, n = self.offset, new[0].shape[2]
        self._reserve(new, n)
        self._write(new, prev)
        self.offset += n

    def _reserve(self, like, n):
        """Capacity for ``n`` more tokens after ``offset`` (arrays shaped like ``like``)."""
        prev = self.offset
        capacity = self.stored[0].shape[2] if self.stored is not None else 0
        if prev + n > capacity:
            n_steps = (self.step + n - 1) // self.step
            grown = empty_like(like, n_steps * self.step)
            if self.stored is not None:
                self._order_rows()  # the copy into the new buffers reads them
                grown = [
                    mx.concatenate([s[..., :prev, :], g], axis=2)
                    for s, g in zip(self.stored, grown)
                ]
            self.stored = tuple(grown)
            self._private_from = 0

    def _write(self, new, position):
        for s, a in zip(self.stored, new):
            s[:, :, position : position + a.shape[2]] = a

    def update_and_fetch(self, keys, values):
        self._rerun = None  # a view attention did not take queries for: as it is
        self._take_launch()
        if self._waiting is not None:
            self.settle()
        if self._defers(keys) and self._compressing(keys, values):
            # Counted now, its slot left empty (zeros) until its row comes back.
            position = self.offset
            self._reserve(self.stored, 1)
            private = self._private_from
            in_place = private is not None and position >= private
            self.offset += 1
            # Not _stored_slice: the rows written in place stay unordered (only the
            # launch reads this view), and handing it to the launch shares no slot.
            view = self._view(self._slice(), keys, values)
            view.pending = PendingStep(keys, values, position, in_place, self.settle)
            if self.recent_exact > 1:
                view.recent = self._recent_rows_now()
            self._waiting = view
            return view, view
        self.settle()
        return super().update_and_fetch(keys, values)

    def _stored_slice(self):
        stored = super()._stored_slice()
        if self._private_from is not None:
            self._private_from = max(self._private_from, self.offset)
        return stored

    def _share_buffers(self):
        self.settle()
        self._private_from = None

    def __copy__(self):
        self._share_buffers()
        copied = type(self).__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo):
        # MLX arrays deep-copy by reference (mlx-lm's prompt caches copy caches so):
        # the copy and this cache share the stored buffers from now on.
        copied = memo[id(self)] = self.__copy__()
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    def _defers(self, keys):
        """Whether this token's encoding waits for its attention launch: one token, all
        sink tokens kept and measured (nothing else reads it before attention), a full
        window of recent tokens where queries read one (the launch reads them exactly
        and hands them back one token on), and a kernel that encodes it."""
        return (
            self.codec is not None
            and self.stored is not None
            and isinstance(keys, mx.array)
            and keys.ndim == 4
            and keys.shape[2] == 1
            and self._sink_count() == self.sink_tokens
            and raw_tail_support(self.codec)
            and (self.recent_exact == 1 or self._window_full())
        )

    def _window_full(self):
        """Whether ``recent`` holds all recent_exact - 1 tokens, in the codec's dtype, of
        keys and values of one head dim (a launch's recent rows hold both)."""
        if self._recent_rows is not None and self._recent_rows[0] is self.codec:
            return True
        return (
            self.recent is not None
            and self.recent[0].shape[2] == self.recent_exact - 1
            and self.recent[0].dtype == self.recent[1].dtype == self.codec.dtype
            and self.codec.key_dim == self.codec.value_dim
        )

    def _recent_rows_now(self):
        """The recent tokens as a launch reads them (``recent_tail``): a row of 4 x
        head_dim each, key and value in the attention domain, then as the model gave
        them. Made here once after a plain update (``recent`` becomes views of it); a
        launch hands the next ones back (``_take_launch``)."""
        held = self._recent_rows
        if held is None or held[0] is not self.codec:
            rows = mx.concatenate(
                [*self.codec.exact(*self.recent), *self.recent], axis=-1
            )
            self._keep_recent_rows(recent_tail(self.codec, rows))
        return self._recent_rows[1]

    def _recent_arrays(self):
        if self._recent_rows is not None:
            return [self._recent_rows[1]]  # ``recent`` are views of these rows
        return super()._recent_arrays()

    def _keep_recent_rows(self, tail):
        self._recent, self._recent_rows = None, (self.codec, tail)

    def _take_launch(self):
        """Store the row the waiting token's launch encoded (where the launch wrote it
        in place, keep it for ``_order_rows``), and the recent tail it handed
        back one token on (no row apart: that tail leads with the row)."""
        view = self._waiting
        if view is None or not view.pending.launched:
            return
        self._waiting = None
        step = view.pending
        if step.recent_rows is not None:
            self._keep_recent_rows(step.recent_rows)
        if step.in_place:
            self._rows_in_place = (step.position, step.row())
        else:
            self._write((tail_row(self.codec, step.row()),), step.position)

    def _order_rows(self):
        """Make the stored rows an array that MLX computes after the last launch that
        wrote a row in place, and so after every launch before it, which each launch is
        (``previous``); then write that launch's row through an op as well. MLX tracks
        neither those writes nor, within a CUDA graph, the buffer they went to.

        The ordering takes one kernel that reads both the buffer and the launch's
        output: a slice update alone would not do, as MLX-CUDA copies a buffer it
        cannot donate in a kernel of its own, ordered only after that buffer's last
        known writer, so the copy could miss the rows launches write meanwhile."""
        if self._rows_in_place is not None:
            position, rows = self._rows_in_place
            self._rows_in_place = None
            row = tail_row(self.codec, rows)
            first, *rest = self.stored
            self.stored = (first | (row[..., :1] & 0), *rest)
            self._write((row,), position)

    def settle(self, view=None):
        """Encode the waiting token as a plain update does and make its view a plain
        one; ``view``: a view whose token was stored by its launch already, attended
        again (its exact copies are made now). Rows written in place are ordered first."""
        self._take_launch()
        self._order_rows()
        if self._waiting is not None and (view is None or view is self._waiting):
            view, self._waiting = self._waiting, None
            step = view.pending
            stored, exact_keys, exact_values = self._encode(
                step.keys, step.values, step.position
            )
            self._write(stored, step.position)
            # sliced after the write, as a plain update
            view.stored = self._stored_slice()
        elif view is not None and view.pending is not None:
            _, exact_keys, exact_values = encode(
                self.codec, view.new_keys, view.new_values
            )
            if view.recent is not None:  # the tokens before it, as its launch read them
                D, recent = self.codec.key_dim, tail_rows(self.codec, view.recent)
                exact_keys, exact_values = (
                    mx.concatenate([recent_part(recent, i, D), a], axis=2)
                    for i, a in enumerate((exact_keys, exact_values))
                )
        else:
            return
        view.new_keys, view.new_values = exact_keys, exact_values
        view.pending = view.recent = None

    def _update_compressed(self, stored, exact_keys, exact_values):
        self._store(stored)
        # Sliced after storing: a slice taken before would pin the old buffer, so the
        # store could not write in place and would copy the whole layer's cache.
        return self._view(self._stored_slice(), exact_keys, exact_values)

    def make_mask(self, *args, **kwargs):
        return create_attention_mask(*args, offset=self.offset, **kwargs)

    @classmethod
    def merge(cls, caches):
        """Join single caches into one batch cache (mlx-lm's server batches through this)."""
        return TurboQuantBatchKVCache.merge(caches)


class TurboQuantBatchKVCache(BatchCache):
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
        self.sink_counts = [self.sink_counts[i] for i in host_indices(batch_indices)]
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
        cache = TurboQuantKVCache(self.scheme, **self._row_options())
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
        return sum(a.nbytes for a in self.stored or ()) + self._held_nbytes()

    @property
    def state(self):
        return [
            *(self.stored or ()),
            *(self.sinks or ()),
            *(self.recent or ()),
            self.offset,
            self.left_padding,
        ]
