"""Each target architecture, tiny and random-weight: what is compressed, how close to fp16."""

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import ArraysCache
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache
from tiny_models import ARCHITECTURES, FLOAT32

import mlx_lm_turbo.cache.attention as turbo_attention
from mlx_lm_turbo import (
    TurboQuantKVCache,
    TurboQuantRotatingKVCache,
    make_prompt_cache,
    plan,
)
from mlx_lm_turbo.tools.quality import teacher_forced_logprobs

TOKENS = mx.random.randint(3, 262, (48,), key=mx.random.key(0))


def kl(reference, other):
    return (mx.exp(reference) * (reference - other)).sum(-1).mean().item()


def with_trained_score_spread(model):
    """Gemma 4 attends with scale 1.0 over RMS-normed queries and keys: with random norm
    weights the scores of its 256/512-dim heads spread ~16, near one-hot attention that
    amplifies any error a thousandfold (KL 0.03 at 8 bits). A trained q_norm keeps them
    near unit spread; scaling it by 1/sqrt(head_dim) does that here, every path (sliding,
    full, KV-shared) unchanged, so Gemma 4 is held to the bound every family meets."""
    for name, module in model.named_modules():
        if name.endswith("self_attn.q_norm"):
            module.weight = module.weight / module.weight.shape[0] ** 0.5
    return model


def model_and_fp16_logprobs(arch, tiny_model):
    """A tiny model of ``arch`` (Gemma 4's with its scores spread as trained) and its
    log-probabilities of TOKENS through mlx-lm's own cache."""
    model, _ = load(str(tiny_model(arch)))
    if arch.startswith("gemma4"):
        model = with_trained_score_spread(model)
    cache = mlx_make_prompt_cache(model)
    return model, teacher_forced_logprobs(model, TOKENS, cache, 32)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_compressed_and_close_to_fp16(arch, tiny_model):
    model, reference = model_and_fp16_logprobs(arch, tiny_model)
    errors = {}
    for scheme in ("turbo8", "turbo4", "turbo2"):
        # W 1: the compression's own error (the default window reads most of TOKENS exactly)
        cache = make_prompt_cache(model, scheme, recent_exact=1)
        errors[scheme] = kl(
            reference, teacher_forced_logprobs(model, TOKENS, cache, 32)
        )
    assert errors["turbo8"] < 1e-4, errors
    assert errors["turbo8"] < errors["turbo4"] < errors["turbo2"], errors

    fp16 = mlx_make_prompt_cache(model)
    turbo = make_prompt_cache(model, "turbo4")  # the defaults, window included
    for c in (fp16, turbo):
        teacher_forced_logprobs(model, TOKENS, c, 32)
    ratio_limit = 0.27 / (2 if arch in FLOAT32 else 1)  # 4.25 bits/value vs 16 (or 32)
    for f, t in zip(fp16, turbo):
        if isinstance(f, ArraysCache):
            assert type(t) is ArraysCache  # recurrent state untouched
        else:
            assert isinstance(t, (TurboQuantKVCache, TurboQuantRotatingKVCache))
            assert type(t) is (
                TurboQuantRotatingKVCache
                if hasattr(f, "max_size")
                else TurboQuantKVCache
            )
            # the stored arrays; nbytes adds the per-layer calibration vectors (mean,
            # scale), the exact sink tokens (held as given and in the attention domain)
            # and their query energies, and the window's recent tokens (as given; on a
            # GPU that decodes through the fused kernel also in the attention domain,
            # the rows its launches read)
            stored = sum(a.nbytes for a in t.stored)
            assert stored <= ratio_limit * f.nbytes, (arch, stored, f.nbytes)
            fixed = stored + t.codec.key_mean.nbytes + t.codec.key_scale.nbytes
            fixed += 2 * sum(a.nbytes for a in t.sinks or ())
            assert (t.sink_query_energy is None) == (t.sinks is None)
            fixed += 0 if t.sinks is None else t.sink_query_energy.nbytes
            recent = sum(a.nbytes for a in t.recent or ())
            assert t.recent_exact == 16 and recent > 0
            assert t.nbytes in (fixed + recent, fixed + 2 * recent)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_asymmetric_and_fp16_key_schemes_on_every_architecture(arch, tiny_model):
    # tests/test_cli.py runs each architecture through the command line with one scheme
    # of four; here every architecture takes the other widths' caches in-process.
    model, reference = model_and_fp16_logprobs(arch, tiny_model)
    errors = {}
    for scheme in ("turbo3", "turbo4v2", "turbo0v4"):
        cache = make_prompt_cache(model, scheme, boundary_skip=0, recent_exact=1)
        logprobs = teacher_forced_logprobs(model, TOKENS, cache, 32)
        assert mx.all(mx.isfinite(logprobs)).item(), scheme
        compressed = [
            c
            for c in cache
            if isinstance(c, (TurboQuantKVCache, TurboQuantRotatingKVCache))
        ]
        assert compressed and {c.scheme.name for c in compressed} == {scheme}
        errors[scheme] = kl(reference, logprobs)
    # fp16 keys and 4-bit values err less than 3-bit keys and values
    assert errors["turbo0v4"] < errors["turbo3"], errors


@pytest.mark.parametrize(
    "arch, kinds",
    [
        ("qwen3_5", ["state"] * 3 + ["kv"] + ["state"] * 3 + ["kv"]),
        ("nemotron_h", ["state", "kv", "state", "kv"]),
        ("gpt_oss", ["rotating", "kv"] * 2),
        ("gemma4", ["rotating", "rotating", "kv", "rotating"]),
    ],
)
def test_boundary_skip_counts_attention_layers(arch, kinds, tiny_model):
    model, _ = load(str(tiny_model(arch)))
    _, _, layers, _ = plan(model, "turbo3", boundary_skip=1)
    assert [p.kind for p in layers] == kinds
    attention = [p for p in layers if p.kind != "state"]
    assert attention[0].scheme.name == attention[-1].scheme.name == "turbo8"
    assert all(p.scheme.name == "turbo3" for p in attention[1:-1])
    assert all(p.scheme is None for p in layers if p.kind == "state")


def test_gemma4_kv_shared_layers_attend_to_the_donors_compressed_kv(
    tiny_model, monkeypatch
):
    model, _ = load(str(tiny_model("gemma4_text")))
    calls = []
    original = turbo_attention.turbo_scaled_dot_product_attention

    def counting(queries, kv, *args, **kwargs):
        calls.append(kv.codec.layer)
        return original(queries, kv, *args, **kwargs)

    monkeypatch.setattr(turbo_attention, "turbo_scaled_dot_product_attention", counting)
    cache = make_prompt_cache(model, "turbo4", boundary_skip=0)
    assert len(cache) == 4  # 6 layers, the last 2 share K/V
    mx.eval(model(TOKENS[None, :20], cache=cache))
    # all 6 layers went through the turbo path; the shared ones with donor codecs
    assert len(calls) == 6 and sorted(set(calls)) == [0, 1, 2, 3]


@pytest.mark.parametrize("arch", ["llama", "gpt_oss"])
def test_compact_schemes_are_the_plain_schemes_storage(tiny_model, arch):
    """-compact (the Swift port's name for compressed-domain decode) is accepted
    everywhere and stores exactly what the plain scheme stores."""
    model, _ = load(str(tiny_model(arch)))
    plain, compact = (
        make_prompt_cache(model, "turbo3"),
        make_prompt_cache(model, "turbo3-compact"),
    )
    tokens = mx.array([[1, 2, 3, 4, 5, 6, 7]])
    assert mx.array_equal(
        model(tokens, cache=plain), model(tokens, cache=compact)
    ).item()
    for a, b in zip(plain, compact):
        assert [x.shape for x in a.state if isinstance(x, mx.array)] == [
            x.shape for x in b.state if isinstance(x, mx.array)
        ]
        assert a.nbytes == b.nbytes
