"""End to end through real mlx-lm model code (tiny random-weight llama)."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache, RotatingKVCache
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

from mlx_lm_turbo import TurboQuantKVCache, TurboQuantRotatingKVCache, make_prompt_cache
from mlx_lm_turbo.errors import UnsupportedModelError


def tiny_llama(head_dim=128, layers=6, sliding_window=None, seed=0):
    mx.random.seed(seed)
    layer_types = None
    if sliding_window:
        layer_types = ["sliding_attention", "full_attention"] * (layers // 2)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=256,
        num_hidden_layers=layers,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        rms_norm_eps=1e-5,
        vocab_size=300,
        layer_types=layer_types,
        sliding_window=sliding_window,
    )
    model = llama.Model(args)
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())
    return model


def teacher_forced_logits(model, cache, tokens, prefill, chunk):
    """Prefill in chunks, then one token at a time; logits of every decode step."""
    for start in range(0, prefill, chunk):
        model(tokens[None, start : min(prefill, start + chunk)], cache=cache)
    logits = [
        model(tokens[None, i : i + 1], cache=cache)[0, -1]
        for i in range(prefill, tokens.size)
    ]
    return mx.stack(logits).astype(mx.float32)


def kl(reference, other):
    log_p = reference - mx.logsumexp(reference, axis=-1, keepdims=True)
    log_q = other - mx.logsumexp(other, axis=-1, keepdims=True)
    return (mx.exp(log_p) * (log_p - log_q)).sum(-1).mean().item()


@pytest.mark.parametrize("head_dim", [128, 96])
def test_logits_close_to_fp16_and_error_grows_as_bits_drop(head_dim):
    model = tiny_llama(head_dim)
    tokens = mx.random.randint(0, 300, (140,), key=mx.random.key(1))
    reference = teacher_forced_logits(
        model, mlx_make_prompt_cache(model), tokens, 120, 50
    )
    errors = {}
    for scheme in ("turbo8", "turbo4", "turbo3", "turbo2"):
        cache = make_prompt_cache(model, scheme, boundary_skip=0)
        assert all(type(c) is TurboQuantKVCache for c in cache)
        errors[scheme] = kl(
            reference, teacher_forced_logits(model, cache, tokens, 120, 50)
        )
    assert errors["turbo8"] < 1e-3
    assert errors["turbo8"] < errors["turbo4"] < errors["turbo3"] < errors["turbo2"]


def test_sliding_window_layers_get_the_rotating_cache():
    model = tiny_llama(64, sliding_window=32)
    cache = make_prompt_cache(model, "turbo8", boundary_skip=0)
    assert [type(c) for c in cache] == [
        TurboQuantRotatingKVCache,
        TurboQuantKVCache,
    ] * 3
    assert cache[0].max_size == 32
    tokens = mx.random.randint(0, 300, (100,), key=mx.random.key(2))
    reference = teacher_forced_logits(
        model, mlx_make_prompt_cache(model), tokens, 80, 30
    )
    assert kl(reference, teacher_forced_logits(model, cache, tokens, 80, 30)) < 1e-3


def test_boundary_layers_count_attention_layers():
    model = tiny_llama(64, layers=6)
    schemes = [c.scheme.name for c in make_prompt_cache(model, "turbo3")]
    assert schemes == ["turbo3"] * 6  # no boundary layers by default
    schemes = [
        c.scheme.name for c in make_prompt_cache(model, "turbo3", boundary_skip=2)
    ]
    assert schemes == ["turbo8", "turbo8", "turbo3", "turbo3", "turbo8", "turbo8"]
    schemes = [
        c.scheme.name for c in make_prompt_cache(model, "turbo0v4", boundary_skip=1)
    ]
    assert schemes == [
        "turbo0v8",
        "turbo0v4",
        "turbo0v4",
        "turbo0v4",
        "turbo0v4",
        "turbo0v8",
    ]


def test_none_scheme_gives_mlx_lm_caches():
    model = tiny_llama(64)
    assert all(type(c) is KVCache for c in make_prompt_cache(model, "none"))
    sliding = tiny_llama(64, sliding_window=32)
    assert [type(c) for c in make_prompt_cache(sliding, "none")] == [
        RotatingKVCache,
        KVCache,
    ] * 3


def test_generate_step_chunked_prefill_keeps_only_compressed_history(monkeypatch):
    model = tiny_llama(128)
    cache = make_prompt_cache(model, "turbo4", boundary_skip=0)
    seen = []
    original = TurboQuantKVCache.update_and_fetch

    def spy(self, keys, values):
        view, _ = original(self, keys, values)
        # the persistent cache holds compressed arrays only; fp16 is the chunk itself
        assert self.uncompressed is None and all(
            a.dtype in (mx.uint32, mx.float16) for a in self.stored
        )
        assert self.stored[0].dtype == mx.uint32
        seen.append(keys.shape[2])
        return view, view

    monkeypatch.setattr(TurboQuantKVCache, "update_and_fetch", spy)
    prompt = mx.random.randint(0, 300, (300,), key=mx.random.key(3))
    tokens = [
        t
        for t, _ in zip(
            generate_step(
                prompt, model, prompt_cache=cache, prefill_step_size=64, max_tokens=4
            ),
            range(4),
        )
    ]
    assert len(tokens) == 4
    fp16 = mlx_make_prompt_cache(model)
    list(
        zip(
            generate_step(
                prompt, model, prompt_cache=fp16, prefill_step_size=64, max_tokens=4
            ),
            range(4),
        )
    )
    assert max(seen) <= 64 and cache[0].offset == fp16[0].offset > 300
    # turbo4's 0.26 plus the 16 exact sink tokens (held twice: as given, and in the
    # attention domain), 0.1 of fp16 at this short length; and the window's 15 recent
    # tokens (as given; where the fused GPU kernel decodes, in the attention domain too)
    window = sum(a.nbytes for c in cache for a in c.recent or ())
    assert (
        sum(c.nbytes for c in cache) < 0.37 * sum(c.nbytes for c in fp16) + 2 * window
    )


def fake_model(model_type, cache_class):
    class Model(nn.Module):
        layers = [None]

        def make_cache(self):
            return [cache_class()]

    model = Model()
    model.model_type = model_type
    return model


def test_unknown_cache_types_are_refused():
    class MysteryCache:
        pass

    with pytest.raises(
        UnsupportedModelError,
        match="cannot serve model type 'mystery': its layer 0 keeps a "
        "MysteryCache, which TurboQuant cannot compress",
    ):
        make_prompt_cache(fake_model("mystery", MysteryCache), "turbo4")
