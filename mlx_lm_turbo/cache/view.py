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


class PendingStep:
    """A decode token its cache left for the attention launch to encode
    (``TurboKV.pending``): made by the cache, filled in by attention, read back by the
    cache on its next call.

    ``keys``/``values``: the token as the model gave it; ``position``: its slot;
    ``in_place``: whether the launch writes the token's row into that slot itself (no
    one else can hold it). Attention sets ``launched`` once a launch encoded the token,
    and ``rows``/``recent_rows`` to what it returned: the token's packed row, or, with
    a window, the next step's recent tail led by that row. Where no launch takes the
    call, or the view is attended again, attention calls ``settle(view)``: the cache
    encodes the token as a plain update does (or makes the view's exact copies), and
    the view becomes a plain one.
    """

    __slots__ = (
        "keys",
        "values",
        "position",
        "in_place",
        "settle",
        "launched",
        "rows",
        "recent_rows",
    )

    def __init__(self, keys, values, position, in_place, settle):
        self.keys, self.values = keys, values
        self.position, self.in_place = position, in_place
        self.settle = settle
        self.launched = False
        self.rows = self.recent_rows = None

    def row(self):
        """What the launch returned that the token's row is sliced from."""
        return self.rows if self.rows is not None else self.recent_rows


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

    ``pending``: a ``PendingStep`` where the last token (a decode step's) is not
    encoded yet. ``new_keys``/``new_values`` then hold it as the model gave it, and its
    slot in ``stored`` holds no row: attention hands the token to the fused kernel,
    which encodes it in the same launch, or has its cache encode it first
    (``PendingStep.settle``), which makes this a plain view. Where each query also
    reads the tokens before it exactly (``window`` > 1), ``recent`` holds the
    ``window - 1`` tokens before the pending one, a row of 4 x head_dim each: key and
    value in the attention domain, then as the model gave them (the launch reads the
    first half and hands the rows back one token on).

    ``left_padding``: (B,) the padding before each batch row's first token, from a
    batch cache whose masks (``causal_padding_mask``) are the causal mask and this
    padding alone; None elsewhere.

    ``calibrating``: None, or a function of this view and its queries that its cache
    needs before attention reads the view (its key calibration measures the sink
    tokens' queries, which only attention sees): called first, it makes the update
    again with them, into this view.

    Those two are all that flows back from attention to a cache.
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
