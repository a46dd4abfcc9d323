"""Exact bit packing of codebook indices into uint32 words.

A vector of ``dim`` b-bit indices is one bit stream of ``dim * b`` bits in
``ceil(dim * b / 32)`` words: 8 per word at 4 bits, 16 at 2, 4 at 8, and at 3, 5
and 6 bits 32 values in 3, 5 and 6 words, a value straddling two words where it falls.
"""

from functools import lru_cache

import mlx.core as mx
import numpy as np

PACKABLE_BITS = (1, 2, 3, 4, 5, 6, 8)


def packed_words(dim: int, bits: int) -> int:
    return -(-dim * bits // 32)


@lru_cache(maxsize=None)
def _layout(dim, bits):
    """Per value: its first word, its shift there, and where its high bits spill."""
    offsets = np.arange(dim) * bits
    word, shift = offsets // 32, offsets % 32
    spills = shift + bits > 32
    n_words = packed_words(dim, bits)

    # For packing: each word gathers the (value, left shift, right shift)
    # pieces that land in it; the padding piece reads an appended zero.
    pieces = [[] for _ in range(n_words)]
    for i in range(dim):
        pieces[word[i]].append((i, shift[i], 0))
        if spills[i]:
            pieces[word[i] + 1].append((i, 0, 32 - shift[i]))
    width = max(len(p) for p in pieces)
    table = np.zeros((n_words, width, 3), dtype=np.uint32)
    table[..., 0] = dim
    for w, p in enumerate(pieces):
        table[w, : len(p)] = p

    # For unpacking: value i = (word[i] >> shift | word[i]+1 << (32 - shift)) & mask. Values
    # that do not spill read a valid word shifted by 0 and masked off by a 0 multiplier, so
    # every op is shape-free in the leading dims (safe under shapeless compile).
    def as_mx(a):
        return mx.array(a.astype(np.uint32))

    return {
        "pack_index": as_mx(table[..., 0].reshape(-1)),
        "pack_left": as_mx(table[..., 1]),
        "pack_right": as_mx(table[..., 2]),
        "width": width,
        "word": as_mx(word),
        "shift": as_mx(shift),
        "spills": bool(spills.any()),
        "high_word": as_mx(np.minimum(word + 1, n_words - 1)),
        "high_shift": as_mx(np.where(spills, 32 - shift, 0)),
        "spill_mask": as_mx(spills),
    }


def pack(indices: mx.array, bits: int) -> mx.array:
    """(..., dim) integer indices < 2**bits -> (..., packed_words(dim, bits)) uint32."""
    if bits not in PACKABLE_BITS:
        raise ValueError(f"cannot pack {bits}-bit values; supported: {PACKABLE_BITS}")
    dim = indices.shape[-1]
    layout = _layout(dim, bits)
    values = indices.astype(mx.uint32)
    values = mx.concatenate(
        [values, mx.zeros((*values.shape[:-1], 1), mx.uint32)], axis=-1
    )
    gathered = mx.take(values, layout["pack_index"], axis=-1)
    gathered = gathered.reshape(*values.shape[:-1], -1, layout["width"])
    pieces = (gathered >> layout["pack_right"]) << layout["pack_left"]
    # The pieces occupy disjoint bits, so their sum is their bitwise or.
    return pieces.sum(axis=-1).astype(mx.uint32)


def three_bit_groups(words: mx.array, dim: int):
    """For 3-bit streams of whole 32-value groups (``dim % 32 == 0``): the first,
    second and third word of every group, as strided views; else None."""
    if dim % 32:
        return None
    return words[..., 0::3], words[..., 1::3], words[..., 2::3]


def unpack_three_bit_groups(w0: mx.array, w1: mx.array, w2: mx.array) -> mx.array:
    """The 32 values of each group from its three words: shifts and masks only, so
    (unlike the strided slicing before it) safe under shapeless compile."""
    w0, w1, w2 = w0[..., None], w1[..., None], w2[..., None]
    # Group value j sits at bit 3j: values 0-9 in word 0, 11-20 in word 1, 22-31 in
    # word 2; value 10 starts at bit 30 of word 0 and value 21 at bit 31 of word 1.
    shifts = mx.arange(0, 30, 3, dtype=mx.uint32)
    values = mx.concatenate(
        [
            w0 >> shifts,
            (w0 >> 30) | (w1 << 2),
            w1 >> (shifts + 1),
            (w1 >> 31) | (w2 << 1),
            w2 >> (shifts + 2),
        ],
        axis=-1,
    )
    return mx.flatten(values & 7, -2, -1)


def unpack(words: mx.array, bits: int, dim: int) -> mx.array:
    """(..., packed_words(dim, bits)) uint32 -> (..., dim) uint32 indices."""
    if 32 % bits == 0 and dim * bits % 32 == 0:
        # Word-aligned widths: shift every word by each slot's offset, no gathers.
        shifts = mx.arange(0, 32, bits, dtype=mx.uint32)
        values = (words[..., None] >> shifts) & ((1 << bits) - 1)
        return mx.flatten(
            values, -2, -1
        )  # flatten, not reshape: safe under shapeless compile
    if bits == 3 and dim % 32 == 0:
        return unpack_three_bit_groups(*three_bit_groups(words, dim))
    layout = _layout(dim, bits)
    values = mx.take(words, layout["word"], axis=-1) >> layout["shift"]
    if layout["spills"]:
        high = mx.take(words, layout["high_word"], axis=-1) << layout["high_shift"]
        values = values | (high * layout["spill_mask"])
    return values & ((1 << bits) - 1)
