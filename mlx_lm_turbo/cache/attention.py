"""Attention over TurboQuant caches, in the rotated domain.

The query is calibrated and rotated once, keys and values are dequantized
straight into the rotated domain (codebook level times norm, no per-key inverse
rotation), and the output is rotated back once. The compressed history is read
in blocks of tokens merged by an online softmax (running maximum, running sum,
running output), so a layer's transient memory is bounded by a block whatever
the context: the whole history is never dequantized at once. A long prefill chunk's
queries go in slices, so the running output is bounded by a slice, not the chunk.

Which keys are read exactly is ``TurboKV``'s rule (see its docstring): the
sink tokens, and the exact tail within the query's window; every other key is
read from the compressed store.
"""

from typing import Optional, Union

import mlx.core as mx

from ..codec.codec import dequantize_rotated, split_rows
from ..kernels import (
    fused_decode_and_encode,
    fused_decode_attention,
    fused_prefill_attention,
)
from ..kernels.dispatch import KERNEL_ENV, gpu_backend, kernel_mode
from ..kernels.prefill_attention import settle_layer, with_sinks
from .view import TurboKV, causal_padding_mask

# Scores and softmax run in float32: exact enough for every model dtype, and on
# CPU float32 matmuls are several times faster than float16 ones.
_COMPUTE_DTYPE = mx.float32
# Largest key block at decode, and the score elements (queries x keys, 8 MiB in
# float32) a block may hold during prefill. Peak memory grows with the block (a 1K-query
# chunk: 640 MiB at 2^24 score elements, 117 MiB at 2^21) while CPU speed barely moves.
# On MLX-CUDA each small op costs tens of microseconds on the host, so there a prefill
# block holds 4x as many scores.
DECODE_BLOCK_TOKENS = 512
PREFILL_BLOCK_SCORES = 1 << (23 if gpu_backend() == "cuda" else 21)
PREFILL_BLOCK_TOKENS = 512  # the most keys a prefill block reads, whatever fits
# A prefill chunk whose layer's history dequantized (keys and values, model dtype) and
# mask fit this goes to MLX's fused attention (dense_prefill_attention): a layer's fp16
# K/V at 128K tokens of 8 heads of 128 dims. The mask goes in slices of query rows of at
# most DENSE_MASK_BYTES (bool, then additive in the model dtype).
DENSE_PREFILL_BYTES = 512 << 20
DENSE_MASK_BYTES = 64 << 20
# Query rows (batch x query heads x queries) one pass over the history accumulates:
# its float32 running output, query and merge temporaries are each 8 MiB at head_dim
# 128. A longer chunk goes in slices of queries, each reading the history again (the
# dequantizing is small next to the matmuls; a causal slice stops at its last query).
PREFILL_QUERY_ROWS = 1 << 14
_MIN_BLOCK_TOKENS = 16
# Where a key is invisible. Finite, so a block whose keys are all invisible merges
# as zero weight instead of NaN once any visible key follows.
_INVISIBLE = -1e30


def turbo_scaled_dot_product_attention(
    queries: mx.array,
    kv: TurboKV,
    scale: float,
    mask: Union[None, str, mx.array],
    sinks: Optional[mx.array] = None,
) -> mx.array:
    # An update its cache makes again with these queries (its keys calibrate on them).
    if kv.calibrating is not None:
        kv.calibrating(kv, queries)
    # A decode token its cache left for the attention launch to encode: the launch's
    # results go back in the step, which the cache reads on its next call.
    step = kv.pending
    if step is not None:
        if not step.launched:
            launch = fused_decode_and_encode(
                queries, kv, scale, mask, sinks, step.in_place
            )
            if launch is not None:
                out, step.rows, step.recent_rows = launch
                step.launched = True
                return out
        step.settle(kv)
    fused = fused_decode_attention(queries, kv, scale, mask, sinks)
    if fused is not None:  # decode on a GPU: straight from the packed codes
        return fused
    fused = fused_prefill_attention(queries, kv, scale, *_kernel_mask(kv, mask), sinks)
    if fused is not None:  # a prefill chunk on MLX-CUDA: flash attention
        return fused
    if one_pass_decode(queries, kv, sinks):
        return one_pass_decode_attention(queries, kv, scale, mask)
    if dense_prefill_support(queries, kv, mask, sinks) is None:
        dense = dense_prefill_attention(queries, kv, scale, mask, fused_only=True)
        if dense is not None:
            return dense
    return blockwise_attention(queries, kv, scale, mask, sinks)


def _kernel_mask(kv: TurboKV, mask):
    """(mask, left padding) as the prefill kernel takes them: a batch cache's own mask
    is "causal" with its rows' left padding."""
    if (
        isinstance(mask, mx.array)
        and kv.left_padding is not None
        and causal_padding_mask(mask)
    ):
        return "causal", kv.left_padding
    return mask, None


def one_pass_decode(queries, kv: TurboKV, sinks=None):
    """Whether ``one_pass_decode_attention`` serves this call: a decode step (one query
    a row) without attention-sink logits whose exact tail lies wholly in its window."""
    n_exact = 0 if kv.new_keys is None else kv.new_keys.shape[2]
    return (
        queries.shape[2] == 1
        and sinks is None
        and (kv.window is None or n_exact <= kv.window)
    )


def one_pass_decode_attention(queries, kv: TurboKV, scale, mask):
    """``blockwise_attention`` for a ``one_pass_decode`` call in far fewer ops (a small
    model's decode step is bound by their count on CPU):
    the sink tokens lead the first block of the history and the exact tail follows the
    last, each part's scores masked as ``_attend_rows`` masks them, so a history of one
    block is one softmax and one product with the values, and longer ones merge only
    their blocks. Every row takes it alike, so a batch row's output equals the same
    sequence's alone, as on the blockwise path."""
    codec = kv.codec
    B, Hq, L, _ = queries.shape
    Hkv = codec.n_kv_heads
    T = kv.shape[2]
    n_exact = 0 if kv.new_keys is None else kv.new_keys.shape[2]
    history_end = T - n_exact
    q = codec.prepare_queries(queries).astype(_COMPUTE_DTYPE) * scale
    state = _OnlineSoftmax(q.reshape(B, Hkv, Hq // Hkv, L, -1))
    array_mask = None if isinstance(mask, str) else mask  # causal: every key at L = 1

    def part(keys, values, start, end, *masks):
        """(masked scores, values) of the keys at positions [start, end)."""
        block_mask = _mask_block(array_mask, None, T - 1, start, end, Hkv)
        return _masked(state.scores(keys), block_mask, *masks), values

    sink_positions = None if kv.sinks is None else kv.sinks[2][:, 0, :, 0]  # (B|1, S)
    blocks = []
    step = block_tokens(B * Hq, L)
    for start in range(0, history_end, step):
        end = min(start + step, history_end)
        keys, values = _dequantize(codec, kv.stored, start, end)
        not_sink = None
        if sink_positions is not None:
            not_sink = ~_sink_slots(sink_positions, start, end)
        blocks.append([part(keys, values, start, end, not_sink)])
    if sink_positions is not None and history_end > 0:
        sink_keys, sink_values, _ = kv.sinks
        visible = _sinks_visible(sink_positions, history_end, array_mask, None, Hkv)
        scores = _masked(state.scores(sink_keys.astype(_COMPUTE_DTYPE)), visible)
        lead = (scores, mx.broadcast_to(sink_values, (B, *sink_values.shape[1:])))
        blocks = [[lead] + (blocks[0] if blocks else [])] + blocks[1:]
    if n_exact:
        tail = part(
            kv.new_keys.astype(_COMPUTE_DTYPE),
            kv.new_values,
            history_end,
            T,
        )
        blocks = blocks[:-1] + [(blocks[-1] if blocks else []) + [tail]]
    for parts in blocks:
        scores, values = (
            mx.concatenate(arrays, axis=axis) if len(arrays) > 1 else arrays[0]
            for arrays, axis in (
                ([s for s, _ in parts], -1),
                ([v.astype(_COMPUTE_DTYPE) for _, v in parts], 2),
            )
        )
        if len(blocks) == 1:
            out = state.weighted(mx.softmax(scores, axis=-1, precise=True), values)
        else:
            state.add(scores, values)
    if len(blocks) > 1:
        out = state.result()
    return codec.restore_output(out.reshape(B, Hq, L, -1)).astype(queries.dtype)


def dense_prefill_support(queries, kv: TurboKV, mask, sinks=None):
    """Why a call does not go to ``dense_prefill_attention``; None if it does.

    It hands MLX's fused attention the whole history dequantized, so it runs only
    where that attention is fused (cuDNN on MLX-CUDA: float16/bfloat16, head dims up
    to 128; on CPUs MLX would materialise every score) and what it builds fits
    ``DENSE_PREFILL_BYTES``, the bound on a layer's transient memory. On Apple GPUs
    MLX's Metal attention is fused for prefill too; there it runs only under
    ``MLX_LM_TURBO_KERNEL=on`` until a run on Apple hardware has verified it."""
    if queries.shape[2] == 1:
        return "decode"
    backend = gpu_backend()
    if backend == "metal" and kernel_mode() != "on":
        return f"not verified on Apple GPUs yet ({KERNEL_ENV}=on enables it)"
    if backend not in ("cuda", "metal"):
        return "MLX's attention is fused for prefill on GPUs only"
    if queries.dtype not in (mx.float16, mx.bfloat16):
        return f"{queries.dtype} queries (cuDNN attention: float16, bfloat16)"
    codec = kv.codec
    if codec.key_dim != codec.value_dim or codec.key_dim > 128:
        return (
            f"key / value head dims {codec.key_dim} / {codec.value_dim} "
            "(cuDNN attention: equal, at most 128)"
        )
    return dense_prefill_rule(queries, kv, mask, sinks)


def dense_prefill_rule(queries, kv: TurboKV, mask, sinks=None):
    """The backend-independent half of ``dense_prefill_support``."""
    if mask is not None and not isinstance(mask, str):
        return "an array mask"
    if isinstance(mask, str) and mask != "causal":
        return f"mask {mask!r}"
    if sinks is not None:
        return "attention-sink logits"
    B, H, T, D = kv.shape
    keys = T + (0 if kv.new_keys is None else kv.new_keys.shape[2])
    size = queries.dtype.size
    rows = min(queries.shape[2], _dense_query_rows(keys, queries.dtype))
    dense_bytes = 2 * B * H * keys * D * size + rows * keys * (size + 1)
    if dense_bytes > DENSE_PREFILL_BYTES:
        return (
            f"{dense_bytes >> 20} MiB of dequantized history and mask "
            f"(limit {DENSE_PREFILL_BYTES >> 20})"
        )
    return None


def dense_prefill_attention(queries, kv: TurboKV, scale, mask, fused_only=False):
    """Attention of a prefill chunk through MLX's fused attention (a call per slice of
    query rows) over every stored token dequantized (in the model dtype, the exact sink
    tokens written at their positions) followed by the exact tail; a mask gives each
    query the keys ``TurboKV``'s rule reads it: the exact copies of the tail tokens
    within its window, the compressed ones before. The same keys
    ``blockwise_attention`` reads, in one op instead of several per block of keys.
    Needs ``dense_prefill_rule``.

    ``fused_only``: None where MLX has no fused attention for the call (it would
    materialise every score), so the caller reads the history blockwise instead."""
    codec = kv.codec
    L, T = queries.shape[2], kv.shape[2]
    n_exact = 0 if kv.new_keys is None else kv.new_keys.shape[2]
    keys, values = codec.decode(kv.stored)
    if kv.sinks is not None:
        keys, values = (
            with_sinks(a, sink, kv.sinks[2])
            for a, sink in zip((keys, values), kv.sinks)
        )
    if n_exact:
        keys = mx.concatenate([keys, kv.new_keys], axis=2)
        values = mx.concatenate([values, kv.new_values], axis=2)
    queries = codec.prepare_queries(queries)
    key_at = mx.concatenate([mx.arange(T), mx.arange(T - n_exact, T)])[None]
    in_tail = key_at >= T - n_exact
    in_exact_copies = (mx.arange(T + n_exact) >= T)[None]
    rows = _dense_query_rows(T + n_exact, queries.dtype)
    zero = mx.array(0, queries.dtype)
    invisible = mx.array(mx.finfo(queries.dtype).min, queries.dtype)
    outs = []
    for start in range(0, L, rows):
        end = min(start + rows, L)
        query_at = mx.arange(T - L + start, T - L + end)[:, None]
        exact_read = in_tail
        if kv.window is not None:
            exact_read = exact_read & (key_at > query_at - kv.window)
        visible = exact_read == in_exact_copies
        if mask is not None:  # "causal"
            visible = visible & (key_at <= query_at)
        # Additive, so MLX hands it to cuDNN as it is (a bool mask it would convert).
        additive = mx.where(visible, zero, invisible)
        try:
            outs.append(
                mx.fast.scaled_dot_product_attention(
                    queries[:, :, start:end],
                    keys,
                    values,
                    scale=scale,
                    mask=additive,
                    force_fused=fused_only,
                )
            )
        except ValueError:  # MLX: "force_fused=True but no fused kernel ..."
            return None
    out = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
    out = codec.restore_output(out)
    settle_layer(out)
    return out


def _dense_query_rows(keys, dtype):
    """Query rows per slice of a dense prefill's mask over ``keys`` keys."""
    return max(1, DENSE_MASK_BYTES // (keys * (dtype.size + 1)))


def block_tokens(n_rows, n_queries):
    """Keys per block for ``n_rows`` (batch x query heads) of ``n_queries`` queries each."""
    fit = PREFILL_BLOCK_SCORES // max(n_rows * n_queries, 1)
    most = PREFILL_BLOCK_TOKENS if n_queries > 1 else DECODE_BLOCK_TOKENS
    return max(_MIN_BLOCK_TOKENS, min(most, fit))


def _mask_block(mask, query_positions, first_query, key_start, key_end, n_kv_heads):
    """The model's mask over keys [key_start, key_end) for the queries at
    ``query_positions`` (the first at ``first_query``), as (B|1, Hkv|1, G|1, L, t): bool
    (True = visible), additive (float) or None (every key visible)."""
    if mask is None:
        return None
    if isinstance(mask, str):  # "causal", lower-right aligned
        if key_end - 1 <= first_query:  # no key after any query: no ops for a block
            return None
        keys = mx.arange(key_start, key_end)
        return (query_positions[:, None] >= keys[None])[None, None, None]
    block = mask[..., key_start:key_end] if mask.shape[-1] > 1 else mask
    block = block.reshape((1,) * (4 - block.ndim) + block.shape)
    rows, heads = block.shape[:2]
    if heads == 1:
        return block[:, :, None]
    return block.reshape(rows, n_kv_heads, heads // n_kv_heads, *block.shape[2:])


def _masked(scores, *masks):
    for m in masks:
        if m is None:
            continue
        if m.dtype == mx.bool_:
            scores = mx.where(m, scores, _INVISIBLE)
        else:
            scores = scores + m.astype(scores.dtype)
    return scores


class _OnlineSoftmax:
    """Running (max, sum, output) over key blocks, per query row (B, Hkv, G, L)."""

    def __init__(self, queries, first_logit=None):
        B, Hkv, G, L, D = queries.shape
        self.queries = queries.reshape(B, Hkv, G * L, D)
        self.shape = (B, Hkv, G, L)
        if first_logit is None:  # nothing seen yet
            self.max = mx.full((*self.shape, 1), _INVISIBLE, _COMPUTE_DTYPE)
            self.sum = mx.zeros((*self.shape, 1), _COMPUTE_DTYPE)
        else:  # a learned sink logit: weight 1 at its own maximum, a zero value
            self.max, self.sum = first_logit, mx.ones(first_logit.shape, _COMPUTE_DTYPE)
        self.output = None
        self.in_flight = ()  # the last settled merge, while the device runs it

    def scores(self, keys):
        """Scaled query-key scores against (B, Hkv, t, D) keys, as (B, Hkv, G, L, t)."""
        s = self.queries @ keys.swapaxes(-1, -2)
        return s.reshape(*self.shape, keys.shape[2])

    def add(self, scores, values, exact=None, exact_values=None):
        """Merge a block. Where the bool ``exact`` is True a score's weight goes to
        ``exact_values`` instead of ``values``."""
        new_max = mx.maximum(self.max, scores.max(axis=-1, keepdims=True))
        weights = mx.exp(scores - new_max)
        correction = mx.exp(self.max - new_max)
        self.max, self.sum = (
            new_max,
            self.sum * correction + weights.sum(axis=-1, keepdims=True),
        )
        if exact is None:
            out = self.weighted(weights, values)
        else:
            zero = mx.zeros((), weights.dtype)
            out = self.weighted(mx.where(exact, zero, weights), values) + self.weighted(
                mx.where(exact, weights, zero), exact_values
            )
        self.output = out if self.output is None else self.output * correction + out

    def weighted(self, weights, values):
        """``weights`` (B, Hkv, G, L, t) times ``values`` (B|1, Hkv, t, D)."""
        B, Hkv, G, L, t = weights.shape
        return (weights.reshape(B, Hkv, G * L, t) @ values).reshape(B, Hkv, G, L, -1)

    def settle(self):
        """Evaluate the merge so far when a block's scores are large (a prefill chunk):
        left lazy, MLX evaluates every block's scores before merging any, and a chunk's
        memory grows with the context. At decode the blocks are small and this would
        only add a sync per block. One block ahead: this block's merge is queued and the
        previous one waited for, so the host builds the next block while the device runs
        this one (a wait per block left a GPU idle between them), and at most two blocks'
        temporaries are alive."""
        if self.shape[3] > 1:
            settled = (self.max, self.sum, self.output)
            mx.async_eval(*settled)
            mx.eval(*self.in_flight)
            self.in_flight = settled

    def result(self):
        return self.output / self.sum


def _dequantize(codec, stored, start, end):
    """Stored tokens [start, end) as (keys, values) in the rotated domain, compute dtype."""
    *exact_keys, rows = (a[:, :, start:end] for a in stored)
    key_codes, key_norms, value_codes, value_norms = split_rows(rows, codec.key_words)
    values = dequantize_rotated(
        value_codes,
        value_norms,
        codec.scheme.value_bits,
        codec.value_dim,
        _COMPUTE_DTYPE,
    )
    if not codec.scheme.key_bits:
        return exact_keys[0].astype(_COMPUTE_DTYPE), values
    return dequantize_rotated(
        key_codes, key_norms, codec.scheme.key_bits, codec.key_dim, _COMPUTE_DTYPE
    ), values


def blockwise_attention(queries, kv: TurboKV, scale, mask, sinks=None):
    """Attention of (B, Hq, L, D) queries over ``kv`` in blocks of keys (see the module doc)."""
    B, Hq, L, _ = queries.shape
    first_query = kv.shape[2] - L  # the queries are the last L positions
    rows = max(1, PREFILL_QUERY_ROWS // (B * Hq))
    if rows >= L:
        return _attend_rows(queries, kv, scale, mask, sinks, first_query)
    slices = []
    for a in range(0, L, rows):
        b = min(a + rows, L)
        out = _attend_rows(
            queries[:, :, a:b],
            kv,
            scale,
            _mask_rows(mask, a, b),
            sinks,
            first_query + a,
        )
        mx.eval(out)  # else every slice's running state stays alive until the concat
        slices.append(out)
    return mx.concatenate(slices, axis=2)


def _mask_rows(mask, start, end):
    """The model's mask for query rows [start, end): a string mask stays as it is."""
    if mask is None or isinstance(mask, str) or mask.ndim < 2 or mask.shape[-2] == 1:
        return mask
    return mask[..., start:end, :]


def _attend_rows(queries, kv: TurboKV, scale, mask, sinks, first_query):
    """Attention of (B, Hq, L, D) queries at positions ``first_query`` on over ``kv``."""
    codec = kv.codec
    B, Hq, L, _ = queries.shape
    Hkv = codec.n_kv_heads
    G = Hq // Hkv
    T = kv.shape[2]
    n_exact = 0 if kv.new_keys is None else kv.new_keys.shape[2]
    history_end = T - n_exact  # keys before this exist only compressed (or as sinks)
    query_positions = mx.arange(first_query, first_query + L)
    last_query = first_query + L - 1
    # A causal query sees no key after itself: the slice's reading stops there.
    key_end = last_query + 1 if isinstance(mask, str) else T

    q = codec.prepare_queries(queries).astype(_COMPUTE_DTYPE) * scale
    q = q.reshape(B, Hkv, G, L, -1)
    first_logit = None
    if sinks is not None:
        first_logit = mx.broadcast_to(
            sinks.astype(_COMPUTE_DTYPE).reshape(1, Hkv, G, 1, 1), (B, Hkv, G, L, 1)
        )
        # Centring keys lowered every score of a query by its shift; softmax alone
        # ignores that, but not once a sink logit competes: lower the sink logit too.
        shift = codec.score_shift(queries, scale)
        if shift is not None:
            first_logit = first_logit - shift.astype(_COMPUTE_DTYPE).reshape(
                B, Hkv, G, L, 1
            )
    state = _OnlineSoftmax(q, first_logit)

    # Sink tokens in the history: exact keys at their own positions, the compressed
    # copies there masked out. Those in the exact tail are read from it.
    sink_positions = None if kv.sinks is None else kv.sinks[2][:, 0, :, 0]  # (B|1, S)
    if sink_positions is not None and history_end > 0:
        sink_keys, sink_values, _ = kv.sinks
        visible = _sinks_visible(
            sink_positions, history_end, mask, query_positions, Hkv
        )
        scores = state.scores(sink_keys.astype(_COMPUTE_DTYPE))
        state.add(_masked(scores, visible), sink_values.astype(_COMPUTE_DTYPE))

    def is_sink(start, end):
        if sink_positions is None:
            return None
        return _sink_slots(sink_positions, start, end)

    step = block_tokens(B * Hq, L)
    for start in range(0, min(history_end, key_end), step):
        end = min(start + step, history_end)
        keys, values = _dequantize(codec, kv.stored, start, end)
        scores = _masked(
            state.scores(keys),
            _mask_block(mask, query_positions, first_query, start, end, Hkv),
            None if sink_positions is None else ~is_sink(start, end),
        )
        state.add(scores, values)
        state.settle()

    # The exact tail: read exactly within each query's window, compressed beyond it.
    window = kv.window
    for start in range(history_end, key_end, step):
        end = min(start + step, T)
        exact_keys = kv.new_keys[:, :, start - history_end : end - history_end].astype(
            _COMPUTE_DTYPE
        )
        exact_values = kv.new_values[
            :, :, start - history_end : end - history_end
        ].astype(_COMPUTE_DTYPE)
        block_mask = _mask_block(mask, query_positions, first_query, start, end, Hkv)
        scores = state.scores(exact_keys)
        if (
            window is None or start > last_query - window
        ):  # every query reads this block exactly
            state.add(_masked(scores, block_mask), exact_values)
            state.settle()
            continue
        keys, values = _dequantize(codec, kv.stored, start, end)
        keys_at = mx.arange(start, end)
        exact = (keys_at[None] > query_positions[:, None] - window)[None, None, None]
        sink = is_sink(start, end)
        if sink is not None:
            exact = exact | sink
        scores = mx.where(exact, scores, state.scores(keys))
        state.add(_masked(scores, block_mask), values, exact, exact_values)
        state.settle()

    return codec.restore_output(state.result().reshape(B, Hq, L, -1)).astype(
        queries.dtype
    )


def _sinks_visible(positions, history_end, mask, query_positions, n_kv_heads):
    """Which queries read each sink token (B|1, S) from its exact copy: those in the
    history (the exact tail holds the others) that the model's mask lets them see, as
    bool (B|1, 1|Hkv, 1|G, L|1, S) or additive where the mask is. ``query_positions``
    None: one query past every key (a decode step), which a causal mask lets see all."""
    visible = (positions < history_end)[:, None, None, None, :]
    if mask is None:
        return visible
    if query_positions is not None:
        causal = query_positions[:, None] >= positions[:, None, :]
        visible = visible & causal[:, None, None]
    if isinstance(mask, str):
        return visible
    gathered = _mask_at(mask, positions, n_kv_heads)
    if gathered.dtype == mx.bool_:
        return visible & gathered
    return mx.where(visible, gathered.astype(_COMPUTE_DTYPE), _INVISIBLE)


def _sink_slots(positions, start, end):
    """(B|1, 1, 1, 1, end - start): True at the sink tokens' compressed slots among
    positions [start, end), which no query reads (they read the exact copies)."""
    slots = (positions[:, :, None] == mx.arange(start, end)).any(axis=1)
    return slots[:, None, None, None, :]


def _mask_at(mask, positions, n_kv_heads):
    """The model's mask at per-row key positions (B|1, S), as (B, Hkv|1, G|1, L, S)."""
    m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    if m.shape[-1] == 1:
        picked = m
    else:
        index = positions[:, None, None, :]
        m = mx.broadcast_to(m, (max(m.shape[0], index.shape[0]), *m.shape[1:]))
        picked = mx.take_along_axis(
            m,
            mx.broadcast_to(
                index, (m.shape[0], m.shape[1], m.shape[2], index.shape[-1])
            ),
            axis=-1,
        )
    rows, heads = picked.shape[:2]
    if heads == 1:
        return picked[:, :, None]
    return picked.reshape(rows, n_kv_heads, heads // n_kv_heads, *picked.shape[2:])
