"""End-to-end quality against an fp16 cache: teacher-forced next-token distributions.

A prompt of ``prefill`` tokens is processed in one chunk, then the following
tokens are fed one at a time, exactly as decoding does, and each step's
next-token log-probabilities are kept. Comparing them with an fp16 cache's gives
KL divergence, top-1 agreement and perplexity.
"""

import math

import mlx.core as mx


def teacher_forced_logprobs(model, tokens: mx.array, cache, prefill: int, after_prefill=None) -> mx.array:
    """Log-probabilities (len(tokens) - prefill, vocab) predicting tokens[prefill:], float32.

    ``after_prefill(cache) -> cache`` may swap the cache between prefill and decode
    (mlx-lm's ``--kv-bits`` quantizes there).
    """
    logits = model(tokens[None, :prefill], cache=cache)[:, -1:]
    if after_prefill is not None:
        cache = after_prefill(cache)
    steps = [logits]
    for i in range(prefill, tokens.size - 1):
        mx.eval(steps[-1])
        steps.append(model(tokens[None, i:i + 1], cache=cache))
    logits = mx.concatenate(steps, axis=1)[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def compare(reference: mx.array, other: mx.array, targets: mx.array) -> dict:
    """KL(reference || other) per token, top-1 agreement, and both perplexities on targets."""
    kl = (mx.exp(reference) * (reference - other)).sum(axis=-1)
    top1 = (reference.argmax(axis=-1) == other.argmax(axis=-1)).astype(mx.float32)

    def ppl(logprobs):
        return math.exp(-mx.take_along_axis(logprobs, targets[:, None], axis=-1).mean().item())

    return {
        "kl": kl.mean().item(),
        "top1": top1.mean().item(),
        "ppl": ppl(other),
        "ppl_reference": ppl(reference),
    }
