"""End-to-end quality against an fp16 cache: teacher-forced next-token distributions.

A prompt of ``prefill`` tokens is processed in one chunk (its last token on its own:
only that position's logits are used, and leaving the others unevaluated skips the
vocabulary projection over the whole prompt, most of a small model's prefill work at a
large vocabulary), then the following tokens are fed one at a time, exactly as
decoding does, and each step's next-token log-probabilities are kept. Comparing them
with an fp16 cache's gives KL divergence, top-1 agreement and perplexity.
"""

import math
import time

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache


def teacher_forced_logprobs(
    model, tokens: mx.array, cache, prefill: int, after_prefill=None, timings=None
) -> mx.array:
    """Log-probabilities (len(tokens) - prefill, vocab) predicting tokens[prefill:], float32.

    ``after_prefill(cache) -> cache`` may swap the cache between prefill and decode
    (mlx-lm's ``--kv-bits`` quantizes there). A ``timings`` dict receives
    ``prefill_seconds`` and ``decode_seconds`` (all decode steps).
    """
    start = time.perf_counter()
    if prefill > 1:
        model(tokens[None, : prefill - 1], cache=cache)
        mx.eval([c.state for c in cache])
    logits = model(tokens[None, prefill - 1 : prefill], cache=cache)
    mx.eval(logits)
    prefill_done = time.perf_counter()
    if after_prefill is not None:
        cache = after_prefill(cache)
    steps = [logits]
    # As mlx_lm.generate runs decode: the next step's graph is built and queued while
    # this one runs, one step ahead.
    for i in range(prefill, tokens.size - 1):
        steps.append(model(tokens[None, i : i + 1], cache=cache))
        mx.async_eval(steps[-1])
        mx.eval(steps[-2])
    mx.eval(steps[-1])
    if timings is not None:
        timings["prefill_seconds"] = prefill_done - start
        timings["decode_seconds"] = time.perf_counter() - prefill_done
    logits = mx.concatenate(steps, axis=1)[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def compare(reference: mx.array, other: mx.array, targets: mx.array) -> dict:
    """KL(reference || other) per token, top-1 agreement, and both perplexities on targets."""
    kl = (mx.exp(reference) * (reference - other)).sum(axis=-1)
    top1 = (reference.argmax(axis=-1) == other.argmax(axis=-1)).astype(mx.float32)

    def ppl(logprobs):
        return math.exp(
            -mx.take_along_axis(logprobs, targets[:, None], axis=-1).mean().item()
        )

    return {
        "kl": kl.mean().item(),
        "top1": top1.mean().item(),
        "ppl": ppl(other),
        "ppl_reference": ppl(reference),
    }


def _affine_round_trip(x, bits, group_size):
    """``x`` as mlx-lm's ``QuantizedKVCache`` stores it (affine), dequantized."""
    quantized = mx.quantize(x, bits=bits, group_size=group_size)
    return mx.dequantize(*quantized, bits=bits, group_size=group_size).astype(x.dtype)


class _AffineRoundTrip:
    """New keys and values quantized and dequantized on their way into the cache
    (``quant``: ``mx.quantize``'s bits and group size, set by the cache's ``__init__``)."""

    def update_and_fetch(self, keys, values):
        return super().update_and_fetch(
            _affine_round_trip(keys, **self.quant),
            _affine_round_trip(values, **self.quant),
        )


class AffineRoundTripCache(_AffineRoundTrip, KVCache):
    """Keys and values as mlx-lm's ``QuantizedKVCache`` stores them (affine, group 64),
    dequantized for ordinary attention: its quantized matmul has no CUDA kernel for
    every shape, and this runs on every backend with the same quantization error."""

    def __init__(self, bits, group_size=64):
        super().__init__()
        self.quant = dict(bits=bits, group_size=group_size)


class AffineRoundTripRotatingCache(_AffineRoundTrip, RotatingKVCache):
    """A sliding window's ring quantized the same way, still a window: mlx-lm has no
    quantized rotating cache, and an unbounded one would let a sliding-window layer
    attend past its window (another model, not another cache)."""

    def __init__(self, ring, bits, group_size=64):
        super().__init__(ring.max_size, ring.keep)
        self.quant = dict(bits=bits, group_size=group_size)
        if ring.keys is not None:
            self.keys = _affine_round_trip(ring.keys, **self.quant)
            self.values = _affine_round_trip(ring.values, **self.quant)
        self.offset, self._idx = ring.offset, ring._idx


def affine_after_prefill(bits, group_size=64):
    """As ``--kv-bits`` runs: prefill with an fp16 cache, then quantize it (``after_prefill``)."""

    def quantize(cache):
        quantized = []
        for c in cache:
            if isinstance(c, RotatingKVCache):
                quantized.append(AffineRoundTripRotatingCache(c, bits, group_size))
                continue
            q = AffineRoundTripCache(bits, group_size)
            q.update_and_fetch(*c.keys_and_values())
            quantized.append(q)
        return quantized

    return quantize
