"""The batch form of ``TurboQuantKVCache``, for mlx-lm's ``BatchGenerator`` (the server).

It follows mlx-lm's ``BatchKVCache``: sequences are left-padded to a common
length, ``offset`` is per sequence, and ``prepare``/``finalize`` move the right
padding of a batched prefill to the left. Every stored array keeps the token
axis at 2, so padding, rolling and filtering act on the compressed data
directly: nothing passes through fp16 when sequences join or leave a batch.
Each sequence keeps its own key statistics (rows of the codec's ``key_mean``),
measured on its own tokens, padding excluded.
"""

import os
import sys

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, dynamic_roll

from .cache import TurboKV, TurboQuantKVCache, _check_keys_values, _install_attention_dispatch
from .codec import TurboCodec


def _rows(keep, old, new, neutral):
    """Per row: the old statistic where ``keep``, else the new one. A missing
    statistic is the neutral one (no scaling is a scale of ones)."""
    if old is None and new is None:
        return None
    if old is None or old.shape != (new if new is not None else old).shape:
        old = neutral(new)
    if new is None:
        new = neutral(old)
    return mx.where(keep, old, new)


class TurboQuantBatchKVCache:
    step = 256

    def __init__(self, scheme, left_padding, *, seed=0, layer=0, key_calibration=None):
        self.scheme, self.seed, self.layer, self.key_calibration = scheme, seed, layer, key_calibration
        self.codec = None
        self.calibrated = mx.zeros((len(left_padding),), mx.bool_)  # rows whose statistics exist
        self.stored = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding = None
        self._lengths = None

    # -- building ----------------------------------------------------------------
    @classmethod
    def merge(cls, caches):
        first = caches[0]
        for c in caches:
            if c.scheme != first.scheme:
                raise ValueError("Caches of different schemes cannot share a batch.")
            if c.uncompressed is not None:  # the fp16 start ends when a sequence joins a batch
                c.uncompressed_start, history = 0, c._uncompressed_history()
                c.offset, c.uncompressed = 0, None
                c.update_and_fetch(*history)
        lengths = [c.offset for c in caches]
        max_length = max(lengths)
        if os.environ.get("MLX_LM_TURBO_LOG_BATCHES"):  # a diagnostic: one line per layer
            print(f"[mlx-lm-turbo] batching {len(caches)} sequences in layer {first.layer} "
                  f"(cached lengths {lengths})", file=sys.stderr, flush=True)
        batch = cls(first.scheme, [max_length - n for n in lengths], seed=first.seed, layer=first.layer,
                    key_calibration=first.key_calibration)
        codecs = [c.codec for c in caches if c.codec is not None]
        if not codecs:
            return batch
        template = codecs[0]
        batch.codec = template
        if template.key_mean is not None:
            zeros = mx.zeros_like(template.key_mean)
            batch.codec = template.with_statistics(
                mx.concatenate([c.codec.key_mean if c.codec else zeros for c in caches]),
                None if template.key_scale is None else mx.concatenate(
                    [c.codec.key_scale if c.codec else mx.ones_like(template.key_scale) for c in caches]),
            )
        batch.calibrated = mx.array([c.codec is not None for c in caches])
        arrays = [c._stored_slice() for c in caches]
        like = next(a for a in arrays if a is not None)
        rows = []
        for n, a in zip(lengths, arrays):
            pad = TurboQuantKVCache._empty_like(like, max_length - n)
            rows.append([mx.concatenate([p, x], axis=2) for p, x in zip(pad, a)] if a is not None else
                        TurboQuantKVCache._empty_like(like, max_length))
        batch.stored = tuple(mx.concatenate(parts) for parts in zip(*rows))
        batch.offset = batch.offset + max_length
        batch._idx = max_length
        return batch

    def _ensure_codec(self, keys, values):
        if self.codec is None:
            _install_attention_dispatch()
            self.codec = TurboCodec(self.scheme, key_dim=keys.shape[3], value_dim=values.shape[3],
                                    n_kv_heads=keys.shape[1], dtype=keys.dtype, seed=self.seed,
                                    layer=self.layer, key_calibration=self.key_calibration)
        if self.codec.key_calibration == "none" or self.calibrated.all().item():
            return
        # Rows without statistics measure them on this chunk's real tokens.
        position = self._idx + mx.arange(keys.shape[2])
        valid = position[None] >= self.left_padding[:, None]
        if self._lengths is not None:
            valid = valid & (mx.arange(keys.shape[2])[None] < self._lengths[:, None])
        mean, scale = self.codec.key_statistics(keys, valid, per_row=True)
        keep = self.calibrated[:, None, None]
        mean = _rows(keep, self.codec.key_mean, mean, mx.zeros_like)
        scale = _rows(keep, self.codec.key_scale, scale, mx.ones_like)
        self.codec = self.codec.with_statistics(mean, scale)
        self.calibrated = self.calibrated | valid.any(axis=1)

    def update_and_fetch(self, keys, values):
        _check_keys_values(keys, values)
        self._ensure_codec(keys, values)
        stored, exact_keys, exact_values = self.codec.encode(keys, values)
        prev, n = self._idx, keys.shape[2]
        history = tuple(a[..., :prev, :] for a in self.stored) if self.stored is not None and prev else None
        if self.stored is None or prev + n > self.stored[0].shape[2]:
            grown = TurboQuantKVCache._empty_like(stored, (self.step + n - 1) // self.step * self.step)
            if self.stored is not None:
                grown = [mx.concatenate([s[..., :prev, :], g], axis=2) for s, g in zip(self.stored, grown)]
            self.stored = tuple(grown)
        for s, a in zip(self.stored, stored):
            s[..., prev : prev + n, :] = a
        self.offset = self.offset + n
        self._idx += n
        view = TurboKV(self.codec, history, exact_keys, exact_values)
        return view, view

    # -- mlx-lm's batch contract ---------------------------------------------------
    make_mask = BatchKVCache.make_mask

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None):
        if left_padding is not None:
            if self.stored is not None:
                raise ValueError("Left padding can only be added to an empty batch cache.")
            left_padding = mx.array(left_padding)
            self.left_padding = self.left_padding + left_padding
            self.offset = self.offset - left_padding
        if lengths is not None:
            self._lengths = mx.array(lengths)
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self):
        self._lengths = None
        if self._right_padding is not None:
            padding = self._right_padding
            self.stored = tuple(dynamic_roll(a, padding[:, None], axis=2) for a in self.stored)
            self.offset = self.offset - padding
            self.left_padding = self.left_padding + padding
            self._right_padding = None

    def filter(self, batch_indices):
        if self.stored is not None:
            self.stored = tuple(a[batch_indices] for a in self.stored)
        if self.codec is not None and self.codec.key_mean is not None:
            scale = self.codec.key_scale
            self.codec = self.codec.with_statistics(self.codec.key_mean[batch_indices],
                                                    None if scale is None else scale[batch_indices])
        self.calibrated = self.calibrated[batch_indices]
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shift = min(self.left_padding.tolist())
        if shift > 0:
            if self.stored is not None:
                self.stored = tuple(a[..., shift:, :] for a in self.stored)
            self._idx -= shift
            self.left_padding = self.left_padding - shift

    def extend(self, other):
        if other.codec is not None and self.codec is None:
            self.codec = other.codec.with_statistics(None, None)
        idx = max(self._idx, other._idx)
        like = (self.stored or other.stored)

        def justified(c):
            rows = c.offset.shape[0]
            if c.stored is None:
                arrays = [mx.zeros((rows, *a.shape[1:2], 0, *a.shape[3:]), a.dtype) for a in like] if like else None
            else:
                arrays = [a[..., : c._idx, :] for a in c.stored]
            if arrays is not None and idx - c._idx:
                arrays = [mx.concatenate([p, a], axis=2) for p, a in
                          zip(TurboQuantKVCache._empty_like(arrays, idx - c._idx), arrays)]
            return arrays, c.left_padding + (idx - c._idx)

        mine, my_pad = justified(self)
        theirs, their_pad = justified(other)
        if mine is not None:
            self.stored = tuple(mx.concatenate(pair) for pair in zip(mine, theirs))
        self.left_padding = mx.concatenate([my_pad, their_pad])
        self.offset = mx.concatenate([self.offset, other.offset])
        self.calibrated = mx.concatenate([self.calibrated, other.calibrated])
        if self.codec is not None and (self.codec.key_mean is not None or other.codec is not None):
            def stat(c, name, fill):
                value = getattr(c.codec, name) if c.codec is not None else None
                return value if value is not None else fill((c.offset.shape[0], self.codec.n_kv_heads, self.codec.key_dim))
            mean = mx.concatenate([stat(self, "key_mean", mx.zeros), stat(other, "key_mean", mx.zeros)])
            scale = None
            if any(c.codec is not None and c.codec.key_scale is not None for c in (self, other)):
                scale = mx.concatenate([stat(self, "key_scale", mx.ones), stat(other, "key_scale", mx.ones)])
            self.codec = self.codec.with_statistics(mean, scale)
        self._idx = idx

    def extract(self, idx):
        cache = TurboQuantKVCache(self.scheme, seed=self.seed, layer=self.layer,
                                  key_calibration=self.key_calibration)
        padding = self.left_padding.tolist()[idx]
        if self.stored is not None:
            cache.stored = tuple(mx.contiguous(a[idx : idx + 1, :, padding : self._idx]) for a in self.stored)
            scale = self.codec.key_scale
            cache.codec = self.codec.with_statistics(
                None if self.codec.key_mean is None else self.codec.key_mean[idx : idx + 1],
                None if scale is None else scale[idx : idx + 1])
            cache.offset = self._idx - padding
        return cache

    # -- sizes and state -------------------------------------------------------------
    def size(self):
        return self._idx

    def empty(self):
        return self.stored is None

    def is_trimmable(self):
        return True

    def trim(self, n):
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self.stored) if self.stored is not None else 0

    @property
    def state(self):
        arrays = list(self.stored or ())
        return [*arrays, self.offset, self.left_padding]
