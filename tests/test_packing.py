import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_lm_turbo.codec.packing import PACKABLE_BITS, pack, packed_words, unpack


@settings(max_examples=60, deadline=None)
@given(
    bits=st.sampled_from(PACKABLE_BITS),
    dim=st.sampled_from([32, 48, 64, 80, 96, 112, 128, 160, 256, 512]),
    rows=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_round_trip(bits, dim, rows, seed):
    values = np.random.default_rng(seed).integers(0, 2**bits, size=(rows, 2, dim))
    words = pack(mx.array(values), bits)
    assert words.dtype == mx.uint32
    assert words.shape == (rows, 2, packed_words(dim, bits))
    assert np.array_equal(np.array(unpack(words, bits, dim)), values)


@pytest.mark.parametrize("bits, per_word", [(4, 8), (2, 16), (8, 4), (1, 32)])
def test_values_per_word(bits, per_word):
    assert packed_words(128, bits) == 128 // per_word


def test_three_bits_pack_32_values_in_three_words():
    assert packed_words(128, 3) == 12
    assert packed_words(32, 3) == 3
    # value 10 straddles words 0 and 1: its low 2 bits end word 0.
    values = mx.zeros((32,), mx.uint32)
    values[10] = 0b111
    words = np.array(pack(values, 3))
    assert words[0] == 0b11 << 30 and words[1] == 0b1 and words[2] == 0


def test_bit_layout_is_little_endian_stream():
    values = mx.arange(8).astype(mx.uint32)
    assert np.array(pack(values, 4)).tolist() == [0x76543210]


def test_unpackable_width_is_refused():
    with pytest.raises(ValueError, match="cannot pack 7-bit"):
        pack(mx.zeros((32,), mx.uint32), 7)


@pytest.mark.parametrize("bits", PACKABLE_BITS)
@pytest.mark.parametrize("dim", [64, 80, 128])
def test_dequantize_matches_codebook_lookup_at_every_length(bits, dim):
    # The dequantizer is compiled shapeless where it can be: one trace must serve
    # every cache length and batch size, so vary both.
    from mlx_lm_turbo.codec.codebooks import codebook
    from mlx_lm_turbo.codec.codec import dequantize_rotated

    rng = np.random.default_rng(bits * dim)
    for batch, tokens in [(1, 1), (2, 7), (1, 300), (3, 2)]:
        indices = rng.integers(0, 2**bits, size=(batch, 3, tokens, dim))
        norms = mx.array(rng.uniform(0.5, 2.0, size=(batch, 3, tokens, 1))).astype(
            mx.float16
        )
        got = dequantize_rotated(
            pack(mx.array(indices), bits), norms, bits, dim, mx.float16
        )
        expected = codebook(dim, bits).astype(mx.float16)[mx.array(indices)] * norms
        assert mx.array_equal(got, expected), (batch, tokens)
