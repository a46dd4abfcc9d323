"""``TurboKV``: what a turbo cache's ``update_and_fetch`` hands to attention."""

# The last masks the batch KV caches made: the causal mask and the rows' left padding
# alone (mlx-lm's models make one a step, with the first layer's cache, and hand it to
# every layer). Kept by identity, so attention can tell them from any other mask.
_CAUSAL_PADDING_MASKS = []
_MASKS_KEPT = 4


def remember_causal_padding_mask(mask):
    _CAUSAL_PADDING_MASKS.append(mask)
    del _CAUSAL_PADDING_MASKS[:-_MASKS_KEPT]


def causal_padding_mask(mask) -> bool:
    """Whether ``mask`` is one a batch KV cache made: causal, and no key of a row's
    left padding visible (``TurboKV.left_padding``)."""
    return any(mask is m for m in _CAUSAL_PADDING_MASKS)


def recent_part(rows, part, dim):
    """Part ``part`` of recent tokens' rows (``TurboKV.recent``), ``dim`` wide: 0 the
    keys, 1 the values in the attention domain, 2 the keys, 3 the values as the model
    gave them (one head dim for keys and values: the cache hands rows only then)."""
    return rows[..., part * dim : (part + 1) * dim]


class TurboKV:
    """Keys and values as a turbo cache hands them to attention.

    ``stored`` holds the compressed arrays of every token attended to;
    ``new_keys``/``new_values`` hold the last ``n_exact`` tokens exactly (or
    None), already in the rotated, calibrated domain; ``sinks`` (keys, values,
    positions) tokens held exactly elsewhere on the token axis, and where they
    sit, (B or 1, 1, S, 1): the sequences' first tokens (a batch row's unfilled
    slot points at the last token, which the exact tail holds), or in a sliding
    window's ring at decode its newest token.

    Which keys a query reads exactly: query i of L sits at position
    p_i = T - L + i; key t is read exact if it is a sink, or if
    t >= T - n_exact and t > p_i - window (window None = no limit: the whole
    exact tail); otherwise from the compressed store.
    Models pass it through to ``scaled_dot_product_attention`` untouched.

    ``pending``: the cache whose last token (a decode step's) is not encoded yet. Its
    ``new_keys``/``new_values`` are then as the model gave them, and its slot in
    ``stored`` holds no row: attention hands the token to the fused kernel, which
    encodes it in the same launch, or asks the cache to encode it first
    (``TurboQuantKVCache.settle``), which makes this a plain view. Where each query
    also reads the tokens before it exactly (``window`` > 1), ``recent`` holds the
    ``window - 1`` tokens before the pending one, a row of 4 x head_dim each: key and
    value in the attention domain, then as the model gave them (the launch reads the
    first half and hands the rows back one token on).

    ``left_padding``: (B,) the padding before each batch row's first token, from a
    batch cache whose masks (``causal_padding_mask``) are the causal mask and this
    padding alone; None elsewhere.

    ``calibrating``: the cache that still needs this update's queries (its key
    calibration measures the sink tokens' queries, which only attention sees):
    attention hands them over first (``take_queries``), and the cache makes the
    update again with them, into this view.
    """

    __slots__ = (
        "codec",
        "stored",
        "new_keys",
        "new_values",
        "sinks",
        "window",
        "pending",
        "recent",
        "calibrating",
        "left_padding",
    )

    def __init__(
        self,
        codec,
        stored,
        new_keys=None,
        new_values=None,
        sinks=None,
        window=None,
        pending=None,
        recent=None,
        calibrating=None,
        left_padding=None,
    ):
        self.codec, self.stored = codec, stored
        self.new_keys, self.new_values = new_keys, new_values
        self.sinks, self.window = sinks, window
        self.pending, self.recent = pending, recent
        self.calibrating = calibrating
        self.left_padding = left_padding

    @property
    def shape(self):
        """Shape of the keys this stands for, (B, H, T, key_dim)."""
        tokens = self.stored[0] if self.stored is not None else self.new_keys
        return (*tokens.shape[:3], self.codec.key_dim)
