"""What both decode-attention kernels share: which calls they take, the FLAGS template
value, and GPT-OSS's sink logits as they read them (``decode_attention``: the fast
CUDA kernel; ``decode_attention_simd``: the simple one written once for CUDA and Metal).
"""

import math

import mlx.core as mx

MAX_QUERIES = 8  # decode and speculative decoding's verify step; longer are prefill
MAX_SINKS = 64  # exact tokens held apart from the tail, per sequence
MAX_GROUP = 255  # query heads per KV head the decode kernels take
# The inputs both kernels read, in their order: the queries, the codec's constants, the
# key calibration scale, keys stored as they are (turbo0vN), the packed rows, the sink
# tokens (keys, values, positions), the exact tail (keys, values), the mask.
ATTENTION_INPUTS = (
    "q",
    "consts",
    "kscale",
    "keys",
    "rows",
    "sink_keys",
    "sink_values",
    "sink_pos",
    "tail_keys",
    "tail_values",
    "mask",
)


def call_support(queries, kv, mask):
    """Why this call goes to the portable path although the layer is served; None if not."""
    shape = queries.shape
    if shape[2] > MAX_QUERIES:
        return "prefill"
    if shape[1] // kv.codec.n_kv_heads > MAX_GROUP:
        return f"more than {MAX_GROUP} query heads per KV head"
    if kv.stored is None:
        return "no compressed history yet"
    if queries.dtype != kv.codec.dtype:
        return "queries and cache differ in dtype"
    if kv.sinks is not None and kv.sinks[0].shape[2] > MAX_SINKS:
        return f"more than {MAX_SINKS} sink tokens"
    if mask is None:  # a decode step's usual mask: nothing of it to check
        return None
    if isinstance(mask, str) and mask != "causal":
        return f"mask {mask!r}"
    if isinstance(mask, mx.array) and mask.shape[-1] != kv.stored[-1].shape[2]:
        return "a mask that does not span the cache"
    return None


def flags(
    mask_kind,
    mask_bool,
    kscale,
    tail,
    sink_tokens,
    sink_logits,
    raw_tail=0,
    kmean=0,
    in_place=0,
    recent=0,
):
    """The FLAGS template value: the mask kind (0 none, 1 causal, 2 an array) in bits
    0-1, then whether the mask is bool, the keys have a calibration scale, an exact
    tail, sink tokens, attention-sink logits, the tail is raw, the keys have a mean,
    the raw tail's row goes into its slot too, recent rows lead the raw tail (the
    kernel's MASK_KIND ... RECENT)."""
    return (
        mask_kind
        | mask_bool << 2
        | kscale << 3
        | tail << 4
        | sink_tokens << 5
        | sink_logits << 6
        | raw_tail << 7
        | kmean << 8
        | in_place << 9
        | recent << 10
    )


def sink_logits(queries, codec, scale, sinks):
    """GPT-OSS's learned sink logits per query row (B, Hq, L), float32, in log2 units
    and moved by the score shift that centring the keys removed from every score."""
    B, n_q_heads, L, _ = queries.shape
    logits = mx.broadcast_to(sinks.astype(mx.float32)[None, :, None], (B, n_q_heads, L))
    shift = codec.score_shift(queries, scale)
    if shift is not None:
        logits = logits - shift[..., 0]
    return mx.contiguous(logits * math.log2(math.e))
