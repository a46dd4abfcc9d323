"""TurboQuant codec for one attention layer's keys and values.

Each vector (one head, one token) is stored as an fp16 corrected norm and the
packed indices of its rotated unit vector in a Lloyd-Max codebook. The corrected
norm is ``|x| / |codebook[idx]|``, so a reconstruction has the original norm.
A token's key and value of one head are stored as one uint32 row (``join_rows``):
one array to update per decode step, not four (each update is a GPU launch).

Keys are first calibrated per head and channel (see ``KEY_CALIBRATIONS``), with
the inverse scaling folded into the query so attention scores are unchanged in
exact arithmetic. Everything downstream of ``encode`` works in the rotated
domain: the query is rotated once, keys and values are dequantized there, and
the attention output is rotated back once.
"""

import copy
import json
from functools import lru_cache

import mlx.core as mx

from .codebooks import boundaries, check_head_dim, codebook
from .packing import (
    pack,
    packed_words,
    three_bit_groups,
    unpack,
    unpack_three_bit_groups,
)
from .rotation import SIGNS, rotation
from .schemes import KVScheme, parse_scheme

# none:          keys as they are.
# center:        subtract the per-channel mean; softmax ignores the resulting
#                per-query score shift (added back when there are attention sinks).
# center+scale:  also divide each channel by its spread (normalised to unit
#                mean square over channels) and multiply the query by it.
# center+query:  centre, and divide each channel by s_c = (E[k_c^2] / E[q_c^2])^(1/4)
#                of the centred keys and the queries of the same tokens (unit mean
#                square). A rotated key's quantization error is spread evenly over
#                its channels, so a score's error variance goes as
#                sum(E[k_c^2] / s_c^2) * sum(E[q_c^2] s_c^2), which this s minimises;
#                center+scale's s ignores the query. Without the queries: center.
KEY_CALIBRATIONS = ("none", "center", "center+scale", "center+query")
# Calibrating on fewer tokens than this leaves channel spreads too noisy to scale by.
MIN_SCALE_TOKENS = 16
SUPPORTED_DTYPES = (mx.float16, mx.bfloat16, mx.float32)
_FP16_MAX = 65504.0


# Centring spares the codebook each channel's offset (softmax ignores the score shift
# it makes), and the query-aware scale puts the keys' error where the queries look
# least: lower KL than the other three on SmolLM2-135M and Gemma 3 270M
# (benchmarks/key_calibration.py; docs/design.md, "Key calibration").
DEFAULT_KEY_CALIBRATION = "center+query"


def check_key_calibration(key_calibration):
    """``key_calibration`` if it is None (the default) or one of KEY_CALIBRATIONS."""
    if key_calibration is not None and key_calibration not in KEY_CALIBRATIONS:
        raise ValueError(
            f"Unknown key calibration {key_calibration!r}; choose one of "
            f"{', '.join(KEY_CALIBRATIONS)} (or None: {DEFAULT_KEY_CALIBRATION})."
        )
    return key_calibration


def quantize_rotated(y: mx.array, bits: int):
    """Rotated vectors (..., d) -> (packed indices, fp16 corrected norms (..., 1))."""
    head_dim = y.shape[-1]
    norm = mx.linalg.norm(y, axis=-1, keepdims=True)
    unit = y / mx.maximum(norm, 1e-30)
    indices = mx.searchsorted(boundaries(head_dim, bits), unit)
    recon_norm = mx.linalg.norm(
        codebook(head_dim, bits)[indices], axis=-1, keepdims=True
    )
    corrected = mx.minimum(norm / mx.maximum(recon_norm, 1e-30), _FP16_MAX)
    return pack(indices, bits), corrected.astype(mx.float16)


def in_dtype(a: mx.array, dtype) -> mx.array:
    """``a`` in ``dtype``, saturating at float16's largest finite value (NaN stays NaN):
    a rotation can gather a vector's norm into one coordinate, so vectors finite in
    float16 may not be once rotated, and one infinite value (0 x inf in attention's
    weighted sums) would reach rows that give it no weight."""
    if dtype == mx.float16:
        a = mx.where(mx.abs(a) > _FP16_MAX, mx.sign(a) * _FP16_MAX, a)
    return a.astype(dtype)


def join_rows(key_codes, key_norms, value_codes, value_norms):
    """One uint32 row per token and head: the key codes (none where keys are stored
    as they are), the value codes, and a word holding both fp16 norms (key norm in the
    low half, 0 without key codes; value norm in the high half)."""
    if key_norms is None:
        key_norms = mx.zeros_like(value_norms)
    norms = mx.concatenate([key_norms, value_norms], axis=-1).view(mx.uint32)
    parts = (
        [value_codes, norms] if key_codes is None else [key_codes, value_codes, norms]
    )
    return mx.concatenate(parts, axis=-1)


def split_rows(rows, key_words):
    """``join_rows``'s parts back as views: (key codes, key norms, value codes, value
    norms), each keeping the token axis at 2."""
    norms = rows[..., -1:].view(mx.float16)
    return (
        rows[..., :key_words],
        norms[..., :1],
        rows[..., key_words:-1],
        norms[..., 1:],
    )


@lru_cache(maxsize=None)
def _dequantizer(bits: int, head_dim: int, dtype):
    # Straight into the model dtype, so no float32 copy of the cache is made.
    levels = codebook(head_dim, bits).astype(dtype)

    def dequantize(codes, norms):
        return levels[unpack(codes, bits, head_dim)] * norms.astype(dtype)

    if 8 % bits == 0 and head_dim * bits % 32 == 0:
        # Whole codes in each byte (2, 4, 8 bits): a byte indexes a table of its codes'
        # levels, one gather a byte instead of one a code (fewer, larger gathers: faster
        # on CPU, the more so the fewer the bits), compiled once for every cache length.
        table = byte_levels(levels, bits)

        def dequantize_bytes(codes, norms):
            per_byte = table[unpack(codes, 8, head_dim * bits // 8)]
            return mx.flatten(per_byte, -2, -1) * norms.astype(dtype)

        return mx.compile(dequantize_bytes, shapeless=True)
    if bits == 3 and head_dim % 32 == 0:
        # Slicing cannot be compiled shapeless, so the words are split into each
        # group's three outside, and the shifts and scaling inside, fused.
        def dequantize_groups(w0, w1, w2, norms):
            return levels[unpack_three_bit_groups(w0, w1, w2)] * norms.astype(dtype)

        compiled = mx.compile(dequantize_groups, shapeless=True)
        return lambda codes, norms: compiled(*three_bit_groups(codes, head_dim), norms)
    # Gathers (3 bits at head dims 80 and 112) gave wrong results under shapeless compile.
    return dequantize


def byte_levels(levels, bits):
    """(256, 8 // bits): the levels of the codes a byte holds, lowest bits first (as
    ``pack`` puts them)."""
    shifts = mx.arange(0, 8, bits, dtype=mx.uint32)
    codes = (mx.arange(256, dtype=mx.uint32)[:, None] >> shifts) & ((1 << bits) - 1)
    return levels[codes]


def dequantize_rotated(
    codes: mx.array, norms: mx.array, bits: int, head_dim: int, dtype
):
    """Inverse of ``quantize_rotated``, still in the rotated domain, in ``dtype``."""
    return _dequantizer(bits, head_dim, dtype)(codes, norms)


def query_energy(queries: mx.array, n_kv_heads: int) -> mx.array:
    """Each token's squared query channels, averaged over its KV head's query heads and
    over each pair of channels RoPE turns into each other (c and c + D/2, mlx-lm's
    default layout): (B, Hq, L, D) queries -> (B, n_kv_heads, L, D/2), float32 (in
    bfloat16, chunks of other shapes, whose queries differ in float32's last bits,
    could round an energy differently: a step of 2^-9 that moves many codes).
    ``center+query``'s E[q^2]."""
    B, n_q_heads, L, D = queries.shape
    q = queries.astype(mx.float32).reshape(B, n_kv_heads, -1, L, D)
    energy = (q * q).mean(axis=2)
    return (energy[..., : D // 2] + energy[..., D // 2 :]) / 2


def _unit_mean_square(scale):
    return scale / mx.sqrt((scale * scale).mean(axis=-1, keepdims=True))


def _query_aware_scale(key_energy, query_energy):
    """``center+query``'s s = (E[k^2] / E[q^2])^(1/4), unit mean square, from the keys'
    per-channel energies (..., D) and the queries' per pair (..., D/2,
    ``query_energy``). Keys are averaged over the RoPE pairs too: the sink tokens sit
    at the first positions, where the pairs have barely turned, and later tokens turn
    them all the way."""
    half = key_energy.shape[-1] // 2
    key_energy = (key_energy[..., :half] + key_energy[..., half:]) / 2

    def floored(energy):
        return mx.maximum(energy, 1e-6 * energy.max(axis=-1, keepdims=True) + 1e-30)

    s = (floored(key_energy) / floored(query_energy)) ** 0.25
    return _unit_mean_square(mx.concatenate([s, s], axis=-1))


class TurboCodec:
    """Rotation, key calibration and codebooks of one layer; stateless once built."""

    def __init__(
        self,
        scheme: KVScheme,
        *,
        key_dim,
        value_dim,
        n_kv_heads,
        dtype,
        seed=0,
        layer=0,
        key_calibration=None,
        signs=SIGNS,
    ):
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"TurboQuant caches take float16, bfloat16 or float32 keys and values, got {dtype}."
            )
        if scheme.key_bits:
            check_head_dim(key_dim)
        check_head_dim(value_dim)
        key_calibration = check_key_calibration(key_calibration)
        if key_calibration is None:
            key_calibration = DEFAULT_KEY_CALIBRATION
        self.scheme = scheme
        self.key_dim, self.value_dim, self.n_kv_heads = key_dim, value_dim, n_kv_heads
        self.dtype = dtype
        self.seed, self.layer, self.signs = seed, layer, signs
        self.key_calibration = key_calibration if scheme.key_bits else "none"
        self.key_rotation = (
            rotation(key_dim, seed, layer, signs) if scheme.key_bits else None
        )
        self.value_rotation = rotation(value_dim, seed, layer, signs)
        self.key_mean = (
            None  # (1 or batch, n_kv_heads, key_dim) float32, set by calibrate()
        )
        self.key_scale = None

    @classmethod
    def for_keys(cls, scheme, keys, values, **options):
        """The codec for K/V shaped and typed like ``keys`` and ``values`` (B, H, T, D)."""
        return cls(
            scheme,
            key_dim=keys.shape[3],
            value_dim=values.shape[3],
            n_kv_heads=keys.shape[1],
            dtype=keys.dtype,
            **options,
        )

    def __deepcopy__(self, memo):
        # Never mutated once calibrated, so cache copies can share it (and MLX
        # dtypes cannot be deep-copied).
        return self

    # -- calibration --------------------------------------------------------
    def key_statistics(
        self, keys: mx.array, valid=None, per_row=False, query_energy=None
    ):
        """Per-head, per-channel (mean, scale) of (B, H, T, D) keys, shaped (B or 1, H, D).

        ``valid`` (B, T) marks the tokens to count (a batch's padding is not);
        ``per_row`` keeps one set of statistics per batch row; ``query_energy``
        (B, H, T, D/2): the same tokens' ``query_energy``, which ``center+query``
        scales by (without it, it only centres).
        """
        if self.key_calibration == "none":
            return None, None
        k = keys.astype(mx.float32)
        weight = (
            mx.ones((k.shape[0], 1, k.shape[2], 1))
            if valid is None
            else valid[:, None, :, None].astype(mx.float32)
        )
        # A token's NaN or infinite key (or query) is left out: in the statistics it
        # would reach every key, the rows that cannot see that token included.
        finite = mx.isfinite(k).all(axis=-1, keepdims=True)
        if query_energy is not None:
            finite = finite & mx.isfinite(query_energy).all(axis=-1, keepdims=True)
            query_energy = mx.where(finite, query_energy, 0.0)
        weight = weight * finite
        k = mx.where(finite, k, 0.0)
        axes = (2,) if per_row else (0, 2)
        count = weight.sum(axis=axes, keepdims=True)

        def average(a):
            return (a * weight).sum(axis=axes, keepdims=True) / mx.maximum(count, 1)

        mean = average(k)
        scale = None
        enough = count >= MIN_SCALE_TOKENS
        if self.key_calibration == "center+scale" and enough.any().item():
            spread = mx.sqrt(average((k - mean) ** 2))
            spread = mx.maximum(
                spread, 1e-3 * spread.max(axis=-1, keepdims=True) + 1e-12
            )
            scale = _unit_mean_square(spread)
        elif self.calibrates_on_queries and query_energy is not None:
            scale = _query_aware_scale(average((k - mean) ** 2), average(query_energy))
        if scale is not None:  # rows with too few tokens: unscaled
            scale = mx.where(enough, scale, 1.0)[:, :, 0]
        return mean[:, :, 0], scale

    def with_statistics(self, key_mean, key_scale):
        """This codec with other key statistics (a batch's rows have their own)."""
        codec = copy.copy(self)
        codec.key_mean, codec.key_scale = key_mean, key_scale
        return codec

    def _calibrated_keys(self, keys):
        k = keys.astype(mx.float32)
        if self.key_mean is not None:
            k = k - self.key_mean[:, :, None]
        if self.key_scale is not None:
            k = k / self.key_scale[:, :, None]
        return k

    @property
    def calibrates_on_queries(self) -> bool:
        """Whether the key calibration measures the sink tokens' queries too."""
        return self.key_calibration == "center+query"

    # -- storage ------------------------------------------------------------
    @property
    def key_words(self):
        """Words of key codes at the start of each stored row (0: keys stored as they are)."""
        return (
            packed_words(self.key_dim, self.scheme.key_bits)
            if self.scheme.key_bits
            else 0
        )

    @property
    def row_words(self):
        """Width of a stored row: key codes, value codes, the norms word."""
        return self.key_words + packed_words(self.value_dim, self.scheme.value_bits) + 1

    def rotated(self, keys: mx.array, values: mx.array):
        """(B, H, L, D) keys and values -> their attention-domain forms (keys calibrated and
        rotated, values rotated), float32 (keys kept as they are where they are stored exactly)."""
        y_values = self.value_rotation.forward(values)
        if not self.scheme.key_bits:
            return keys, y_values
        return self.key_rotation.forward(self._calibrated_keys(keys)), y_values

    def exact(self, keys: mx.array, values: mx.array):
        """Keys and values in the attention domain, unquantized, in the model dtype."""
        return tuple(in_dtype(a, self.dtype) for a in self.rotated(keys, values))

    def encode(self, keys: mx.array, values: mx.array):
        """(B, H, L, D) keys and values -> (stored arrays, exact rotated keys, values).

        Every stored array keeps the token axis at 2. The exact rotated keys and
        values let a token attend to itself without quantization error. The portable
        reference of ``kernels/encode.cu`` (``cache.common.encode`` picks).
        """
        y_keys, y_values = self.rotated(keys, values)
        value_part = quantize_rotated(y_values, self.scheme.value_bits)
        if self.scheme.key_bits:
            stored = (
                join_rows(*quantize_rotated(y_keys, self.scheme.key_bits), *value_part),
            )
        else:
            stored = (keys, join_rows(None, None, *value_part))
        return stored, in_dtype(y_keys, self.dtype), in_dtype(y_values, self.dtype)

    def stored_from_arrays(self, arrays):
        """The stored arrays from format 1-2's separate ones (key codes, key norms or
        keys as they are, value codes, value norms)."""
        if self.scheme.key_bits:
            return (join_rows(*arrays),)
        keys, value_codes, value_norms = arrays
        return keys, join_rows(None, None, value_codes, value_norms)

    def decode(self, stored):
        """Stored arrays -> (keys, values) in the attention domain, model dtype."""
        *exact_keys, rows = stored
        key_codes, key_norms, value_codes, value_norms = split_rows(
            rows, self.key_words
        )
        values = dequantize_rotated(
            value_codes, value_norms, self.scheme.value_bits, self.value_dim, self.dtype
        )
        if not self.scheme.key_bits:
            return exact_keys[0], values
        keys = dequantize_rotated(
            key_codes, key_norms, self.scheme.key_bits, self.key_dim, self.dtype
        )
        return keys, values

    def bytes_per_token(self):
        """Stored bytes per token and KV head (keys + values)."""
        exact_keys = 0 if self.scheme.key_bits else self.key_dim * self.dtype.size
        return exact_keys + 4 * self.row_words

    # -- attention ----------------------------------------------------------
    def _per_query_head(self, stat, n_q_heads):
        return mx.repeat(stat, n_q_heads // self.n_kv_heads, axis=1)[:, :, None, :]

    def prepare_queries(self, queries: mx.array) -> mx.array:
        """Queries (B, Hq, L, D) into the domain the stored keys live in."""
        if not self.scheme.key_bits:
            return queries
        q = queries.astype(mx.float32)
        if self.key_scale is not None:
            q = q * self._per_query_head(self.key_scale, queries.shape[1])
        return self.key_rotation.forward(q).astype(queries.dtype)

    def score_shift(self, queries: mx.array, scale: float):
        """The per-query score offset that centring removed, (B, Hq, L, 1), or None."""
        if self.key_mean is None:
            return None
        mean = self._per_query_head(self.key_mean, queries.shape[1])
        return scale * (queries.astype(mx.float32) * mean).sum(axis=-1, keepdims=True)

    def restore_output(self, output: mx.array) -> mx.array:
        return self.value_rotation.inverse(output).astype(output.dtype)

    # -- persistence --------------------------------------------------------
    def meta(self) -> str:
        return json.dumps(
            {
                "scheme": self.scheme.name,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "n_kv_heads": self.n_kv_heads,
                "dtype": str(self.dtype).split(".")[-1],
                "seed": self.seed,
                "layer": self.layer,
                "key_calibration": self.key_calibration,
                "signs": self.signs,
            }
        )

    @classmethod
    def from_meta(cls, meta: str, key_mean=None, key_scale=None):
        m = json.loads(meta)
        codec = cls(
            parse_scheme(m["scheme"]),
            key_dim=m["key_dim"],
            value_dim=m["value_dim"],
            n_kv_heads=m["n_kv_heads"],
            dtype=getattr(mx, m["dtype"]),
            seed=m["seed"],
            layer=m["layer"],
            key_calibration=m["key_calibration"],
            signs=m["signs"],
        )
        codec.key_mean, codec.key_scale = key_mean, key_scale
        return codec
