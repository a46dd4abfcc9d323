"""``mlx_lm.perplexity --kv-scheme``: evaluate through the compressed cache.

mlx-lm's perplexity runs each sequence through the model in one call with no
cache, so compression would change nothing. With a scheme active, each sequence
goes through TurboQuant caches in chunks of ``CHUNK`` tokens: every token sees
at most ``CHUNK - 1`` exact predecessors and the rest of its context compressed,
as in chunked prefill and (for the compressed part) decoding.
"""

import functools

import mlx.core as mx

from .. import settings

CHUNK = 32


class _ThroughCompressedCache:
    """Stands in for the model: same call, but chunked through fresh turbo caches."""

    def __init__(self, model, active):
        self.model, self.active = model, active

    def __call__(self, inputs):
        from ..plugin.prompt_cache import make_prompt_cache

        cache = make_prompt_cache(
            self.model,
            self.active.scheme,
            uncompressed_start=self.active.uncompressed_start,
            model_path=self.active.model_path,
            **self.active.cache_options(),
        )
        logits = [
            self.model(inputs[:, s : s + CHUNK], cache=cache)
            for s in range(0, inputs.shape[1], CHUNK)
        ]
        return mx.concatenate(logits, axis=1)

    def __getattr__(self, name):
        return getattr(self.model, name)


def eval_ppl_with_plugin(original):
    @functools.wraps(original)
    def eval_ppl(model, *args, **kwargs):
        if settings.active is None:
            return original(model, *args, **kwargs)
        print(
            f"[mlx-lm-turbo] evaluating through {settings.active.scheme.name} caches, "
            f"{CHUNK}-token chunks"
        )
        return original(
            _ThroughCompressedCache(model, settings.active), *args, **kwargs
        )

    return eval_ppl
