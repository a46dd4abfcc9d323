"""Per-layer bit allocation: spend a budget of bits per value where they cut the error most.

Calibration (``layer_sensitivities``): one prefill of a calibration text with an fp16
cache, then one per layer and width with only that layer's keys (or values)
compressed; the KL of the next-token distributions against the fp16 run, averaged
over the text's positions, is that layer's sensitivity at that width. Keys are
probed with 8-bit values (``turbo{k}v8``), values with fp16 keys (``turbo0v{v}``).

Allocation (``allocate``): assuming the layers' errors add up, start every layer's keys
and values at their narrowest width and repeatedly take the widening that removes the
most sensitivity per stored bit, while the all-in average (what ``all_in_bits`` counts:
codes, norms and the exact sink tokens with their query energies at the stated context)
stays within the budget.
"""

import sys
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import mlx.core as mx

from ..codec.schemes import KVScheme

KEY_WIDTHS = (2, 3, 4, 8)
VALUE_WIDTHS = (2, 3, 4, 8)
NORM_BITS = 16  # one fp16 norm per stored vector
QUERY_ENERGY_BITS = 32  # a sink token's query energy per pair of key channels
ATTENTION = "scaled_dot_product_attention"  # where models attend (mlx_lm.models.base)
# Each layer's own compression error is what the plan weighs: no window of exact recent
# tokens hides part of it (and all_in_bits counts none).
WINDOW = 1


@dataclass(frozen=True)
class LayerShape:
    """What one compressed cache entry holds at the stated context."""

    index: int  # cache entry
    kv_heads: int
    key_dim: int
    value_dim: int
    tokens: int  # tokens held (a sliding window holds at most its size)
    sink_tokens: int  # exact copies held besides the compressed ones
    exact_bits: int = 16  # the model's dtype, which exact keys and sink tokens keep
    recent_tokens: int = 0  # exact copies of recent tokens (no query energies)

    @property
    def values(self):
        return self.tokens * self.kv_heads * (self.key_dim + self.value_dim)

    def key_bits(self, width):
        """Stored bits of one token's keys (one KV head) at this width (0: exact)."""
        if width == 0:
            return self.exact_bits * self.key_dim
        return width * self.key_dim + NORM_BITS

    def value_bits(self, width):
        return width * self.value_dim + NORM_BITS

    def fixed_bits(self):
        """The exact sink and recent tokens, and the float32 query energy per pair of
        key channels that center+query calibration keeps with each sink token
        (``codec.query_energy``)."""
        exact = self.exact_bits * (self.key_dim + self.value_dim)
        energies = QUERY_ENERGY_BITS * self.key_dim // 2
        per_head = (self.sink_tokens + self.recent_tokens) * exact
        return self.kv_heads * (per_head + self.sink_tokens * energies)

    def bits(self, scheme: KVScheme):
        per_token = self.key_bits(scheme.key_bits) + self.value_bits(scheme.value_bits)
        return self.tokens * self.kv_heads * per_token + self.fixed_bits()


def all_in_bits(shapes: Sequence[LayerShape], schemes: Dict[int, KVScheme]) -> float:
    """Bits per stored value over every compressed layer: codes, norms, exact sink tokens
    and their query energies."""
    total = sum(s.bits(schemes[s.index]) for s in shapes)
    return total / sum(s.values for s in shapes)


def allocate(
    shapes: Sequence[LayerShape],
    sensitivities: Dict[int, Dict[str, Dict[int, float]]],
    budget: float,
    key_widths: Tuple[int, ...] = KEY_WIDTHS,
    value_widths: Tuple[int, ...] = VALUE_WIDTHS,
) -> Dict[int, KVScheme]:
    """{cache entry: scheme} with all-in bits per value <= ``budget``, minimizing the sum
    of the measured sensitivities (``sensitivities[entry]["key"|"value"][width]``)."""
    total_values = sum(s.values for s in shapes)
    allowed = budget * total_values - sum(s.fixed_bits() for s in shapes)
    # Each layer's keys and values are one choice each: (shape, part, widths, cost).
    choices = []
    for s in shapes:
        unit = s.tokens * s.kv_heads
        choices.append(
            (s, "key", sorted(key_widths), lambda w, s=s, u=unit: u * s.key_bits(w))
        )
        choices.append(
            (
                s,
                "value",
                sorted(value_widths),
                lambda w, s=s, u=unit: u * s.value_bits(w),
            )
        )
    chosen = [widths[0] for _, _, widths, _ in choices]
    spent = sum(cost(w) for (_, _, _, cost), w in zip(choices, chosen))
    if spent > allowed:
        least = all_in_bits(
            shapes,
            {s.index: KVScheme(min(key_widths), min(value_widths)) for s in shapes},
        )
        raise ValueError(
            f"A budget of {budget} bits per value is below the narrowest plan's "
            f"{least:.3f} bits per value all-in at this context; ask for more."
        )
    while True:
        best = None
        for c, ((s, part, widths, cost), width) in enumerate(zip(choices, chosen)):
            error = sensitivities[s.index][part]
            for wider in widths:
                extra = cost(wider) - cost(width)
                gain = error[width] - error[wider]
                if extra <= 0 or gain <= 0 or spent + extra > allowed:
                    continue
                if best is None or gain / extra > best[0]:
                    best = (gain / extra, c, wider, extra)
        if best is None:
            break
        _, c, wider, extra = best
        chosen[c], spent = wider, spent + extra
    widths = {}
    for (s, part, _, _), width in zip(choices, chosen):
        widths.setdefault(s.index, {})[part] = width
    return {i: KVScheme(w["key"], w["value"]) for i, w in widths.items()}


def _logprobs(model, tokens, cache):
    logits = model(tokens[None], cache=cache)[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _kl(reference, other, skip):
    return (mx.exp(reference) * (reference - other)).sum(axis=-1)[skip:].mean().item()


def _capture_attention(model, tokens, cache):
    """{cache entry: (queries, keys, values, scale, mask, output)} of one forward pass,
    read where the model calls mlx-lm's attention."""
    modules = {
        sys.modules[type(m).__module__]
        for m in model.modules()
        if hasattr(sys.modules[type(m).__module__], ATTENTION)
    }
    entry = {id(c): i for i, c in enumerate(cache)}
    captured = {}
    originals = {m: getattr(m, ATTENTION) for m in modules}

    def recorder(original):
        def attend(queries, keys, values, cache, scale, mask, sinks=None):
            output = original(
                queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks
            )
            if id(cache) in entry:
                captured[entry[id(cache)]] = (
                    queries,
                    keys,
                    values,
                    scale,
                    mask,
                    output,
                )
            return output

        return attend

    try:
        for m, original in originals.items():
            setattr(m, ATTENTION, recorder(original))
        mx.eval(model(tokens[None], cache=cache))
    finally:
        for m, original in originals.items():
            setattr(m, ATTENTION, original)
    return captured


def _attention_error(model, index, scheme, captured, first):
    """Squared error of entry ``index``'s attention output with its keys and values
    compressed at ``scheme``, relative to the output's, over query positions ``first``
    onwards."""
    import mlx_lm.models.base as base

    from ..plugin.prompt_cache import make_prompt_cache

    queries, keys, values, scale, mask, exact = captured
    cache = make_prompt_cache(
        model,
        scheme,
        boundary_skip=0,
        recent_exact=WINDOW,
        layer_schemes={index: scheme},
    )
    kv, _ = cache[index].update_and_fetch(keys, values)
    output = base.scaled_dot_product_attention(
        queries, kv, None, cache[index], scale, mask
    )
    error = (output - exact).astype(mx.float32)[:, :, first:]
    norm = exact.astype(mx.float32)[:, :, first:]
    return (error * error).sum().item() / (norm * norm).sum().item()


def layer_sensitivities(
    model,
    tokens: mx.array,
    probe_tokens: int = 128,
    key_widths=KEY_WIDTHS,
    value_widths=VALUE_WIDTHS,
    probe=KVScheme(3, 3),
    progress=lambda message: None,
):
    """{cache entry: {"key": {width: KL}, "value": {width: KL}}} for every compressed layer.

    End-to-end probes are slow (a forward pass each), so each layer gets one: the KL
    over the first ``probe_tokens`` of ``tokens`` (past the exact sink tokens) between
    an fp16 cache and one where only that entry is compressed at ``probe``. The
    attention output's relative squared error, measured on all of ``tokens`` for
    every width (keys with 8-bit values, values with fp16 keys), scales it to each
    width: sensitivity = KL(probe) * error(width) / error(probe)."""
    from ..cache.kv_cache import TurboQuantKVCache
    from ..plugin.adapters import mlx_make_prompt_cache
    from ..plugin.prompt_cache import make_prompt_cache

    skip = TurboQuantKVCache.sink_tokens
    cache = mlx_make_prompt_cache(model)
    captured = _capture_attention(model, tokens, cache)
    entries = [
        i
        for i, c in enumerate(
            make_prompt_cache(model, "turbo4", boundary_skip=0, recent_exact=WINDOW)
        )
        if hasattr(c, "scheme")
    ]
    short = tokens[:probe_tokens]
    reference = _logprobs(model, short, mlx_make_prompt_cache(model))
    mx.eval(reference)
    result = {}
    for i in entries:
        probed = make_prompt_cache(
            model, probe, boundary_skip=0, recent_exact=WINDOW, layer_schemes={i: probe}
        )
        cache = mlx_make_prompt_cache(model)
        cache[i] = probed[i]
        kl = _kl(reference, _logprobs(model, short, cache), skip)
        head = tuple(
            a[:, :, :probe_tokens] if isinstance(a, mx.array) and a.ndim == 4 else a
            for a in captured[i]
        )
        head = (*head[:4], _head_mask(captured[i][4], probe_tokens), head[5])
        gain = kl / max(_attention_error(model, i, probe, head, skip), 1e-12)

        def sensitivity(scheme):
            return gain * _attention_error(model, i, scheme, captured[i], skip)

        result[i] = {
            "key": {k: sensitivity(KVScheme(k, 8)) for k in key_widths},
            "value": {v: sensitivity(KVScheme(0, v)) for v in value_widths},
        }
        progress(f"entry {i}: probe KL {kl:.5f}, {result[i]}")
    return result


def _head_mask(mask, n):
    """The model's mask for the first ``n`` queries and keys."""
    if isinstance(mask, mx.array):
        return mask[..., :n, :n]
    return mask


def layer_shapes(model, context: int):
    """The LayerShape of every compressed entry when the cache holds ``context`` tokens."""
    from ..plugin.prompt_cache import make_prompt_cache

    cache = make_prompt_cache(model, "turbo4", boundary_skip=0, recent_exact=WINDOW)
    model(mx.array([[1]]), cache=cache)
    shapes = []
    for i, c in enumerate(cache):
        if not hasattr(c, "scheme"):
            continue
        window = getattr(c, "max_size", None)
        held = min(context, window) if window else context
        # A sliding window lets its exact sink tokens go once past them.
        sinks = c.sink_tokens if not window or context < window + c.sink_tokens else 0
        codec = c.codec
        shapes.append(
            LayerShape(
                i,
                codec.n_kv_heads,
                codec.key_dim,
                codec.value_dim,
                held,
                sinks,
                8 * c.sinks[0].dtype.size,  # float32 on CPU for some models
            )
        )
    return shapes
