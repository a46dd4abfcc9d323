"""A window of recent tokens read exactly (issue 14, lever 1): with ``recent_exact=W``
each query reads the sink tokens, itself and the W - 1 tokens before it exactly and
every other key compressed, whatever the chunking, a reused or reloaded prefix, or the
batch it shares; caches that cannot be trimmed exactly say so."""

import copy
import json

import mlx.core as mx
import pytest
from helpers import (
    FP16_ROUNDING,
    PROMPT,
    ROUNDING,
    chunked_outputs,
    generate_tokens,
    load_sliding,
    right_padded,
    sequences,
    window_kv,
)
from mlx_lm import load
from mlx_lm.models.cache import (
    LRUPromptCache,
    load_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)

import mlx_lm_turbo.defaults as defaults
import mlx_lm_turbo.settings as settings
from mlx_lm_turbo import (
    TurboQuantKVCache,
    TurboQuantRotatingKVCache,
    make_prompt_cache,
    parse_scheme,
)
from mlx_lm_turbo.attach.files import register_cache_classes
from mlx_lm_turbo.cache.attention import _dequantize, turbo_scaled_dot_product_attention
from mlx_lm_turbo.cache.single import FORMAT_VERSION

H, D = 2, 64
W = 8
CHUNKINGS = [[70], [8, 62], [30, 1, 1, 38], [7] * 10, [1] * 70, [3, 1, 30, 1, 35]]


# -- which keys a query reads exactly ---------------------------------------------
def reference(codec, stored, keys, values, queries, window, max_size=None):
    """Each query's output with the sink tokens and the ``window`` keys up to itself
    exact, every other key compressed (dequantized from ``stored``, in temporal order),
    keys beyond a sliding window of ``max_size`` not seen: dense attention, per query."""
    T = keys.shape[2]
    compressed_keys, compressed_values = _dequantize(codec, stored, 0, T)
    exact_keys, exact_values = (a.astype(mx.float32) for a in codec.exact(keys, values))
    q = codec.prepare_queries(queries).astype(mx.float32)
    outs = []
    for p in range(T):
        t = mx.arange(T)[None, None, :, None]
        exact = (t < TurboQuantKVCache.sink_tokens) | (t > p - window)
        k = mx.where(exact, exact_keys, compressed_keys)
        v = mx.where(exact, exact_values, compressed_values)
        first = 0 if max_size is None else max(0, p - max_size + 1)
        out = mx.fast.scaled_dot_product_attention(
            q[:, :, p : p + 1],
            k[:, :, first : p + 1],
            v[:, :, first : p + 1],
            scale=D**-0.5,
        )
        outs.append(out)
    return codec.restore_output(mx.concatenate(outs, axis=2)).astype(mx.float32)


def sliding_outputs(cache, chunks, keys, values, queries):
    outs, start = [], 0
    for n in chunks:
        mask = cache.make_mask(n, window_size=cache.max_size, return_array=True)
        view, _ = cache.update_and_fetch(
            keys[:, :, start : start + n], values[:, :, start : start + n]
        )
        outs.append(
            turbo_scaled_dot_product_attention(
                queries[:, :, start : start + n], view, D**-0.5, mask
            )
        )
        start += n
    return mx.concatenate(outs, axis=2)


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_a_query_reads_exactly_the_recent_tokens_before_it(chunks):
    # turbo2: reading one key more or less exactly moves an output visibly.
    keys, values, queries = window_kv(70)
    cache = TurboQuantKVCache("turbo2", recent_exact=W)
    got = chunked_outputs(cache, chunks, keys, values, queries).astype(mx.float32)
    errors = {
        w: (
            got
            - reference(cache.codec, cache._stored_slice(), keys, values, queries, w)
        )
        .abs()
        .max()
        .item()
        for w in (W - 1, W, W + 1)
    }
    assert errors[W] <= FP16_ROUNDING, errors
    assert min(errors[W - 1], errors[W + 1]) > 10 * FP16_ROUNDING, errors


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_a_sliding_window_query_reads_exactly_the_recent_tokens_before_it(chunks):
    # A window of 24 wraps its ring many times; decode steps (chunks of 1) write in
    # place, in ring order. The reference reads the same compressed tokens in temporal
    # order from a full cache fed the same way (the same statistics, the same codes).
    keys, values, queries = window_kv(70)
    cache = TurboQuantRotatingKVCache("turbo2", 24, recent_exact=W)
    got = sliding_outputs(cache, chunks, keys, values, queries).astype(mx.float32)
    full = TurboQuantKVCache("turbo2", recent_exact=W)
    chunked_outputs(full, chunks, keys, values, queries)
    errors = {
        w: (
            got
            - reference(
                full.codec, full._stored_slice(), keys, values, queries, w, max_size=24
            )
        )
        .abs()
        .max()
        .item()
        for w in (W - 1, W, W + 1)
    }
    assert errors[W] <= FP16_ROUNDING, errors
    assert min(errors[W - 1], errors[W + 1]) > 10 * FP16_ROUNDING, errors


# -- whole models: chunking, a reused or reloaded prefix --------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt_oss"])
def test_generate_is_the_same_for_every_prefill_step_size(tiny_model, arch):
    model, _ = load_sliding(tiny_model, arch)  # float32 (see test_chunk_invariance)

    def cache(recent):
        return make_prompt_cache(model, "turbo2", boundary_skip=0, recent_exact=recent)

    runs = {
        step: generate_tokens(model, PROMPT, cache(W), step) for step in (64, 16, 7, 1)
    }
    tokens, logprobs = runs[64]
    for step, (t, p) in runs.items():
        assert t == tokens, step
        assert (p - logprobs).abs().max().item() < ROUNDING, step
    # what the window changes is far more than the rounding
    assert (
        generate_tokens(model, PROMPT, cache(1), 64)[1] - logprobs
    ).abs().max().item() > ROUNDING


@pytest.mark.parametrize("arch", ["llama", "gpt_oss"])
@pytest.mark.parametrize("shared", [10, 40])  # inside / past the sink tokens
def test_a_cache_reused_or_reloaded_equals_a_cold_one(
    tiny_model, tmp_path, arch, shared
):
    register_cache_classes()
    model, _ = load_sliding(tiny_model, arch)

    def cache():
        return make_prompt_cache(model, "turbo2", boundary_skip=0, recent_exact=W)

    prefix = cache()
    model(mx.array([PROMPT[:shared]]), cache=prefix)
    path = str(tmp_path / "prefix.safetensors")
    save_prompt_cache(path, prefix)
    cold = generate_tokens(model, PROMPT, cache(), 2048)
    loaded = load_prompt_cache(path)
    for c in loaded:
        meta = json.loads(c.meta_state[0])
        assert (
            meta["format"] == FORMAT_VERSION
            and meta["recent_exact"] == W == c.recent_exact
        )
        assert c.recent[0].shape[2] == W - 1
    for reused in (copy.deepcopy(prefix), loaded):
        got = generate_tokens(model, PROMPT[shared:], reused, 2048)
        assert got[0] == cold[0]
        assert (got[1] - cold[1]).abs().max().item() < ROUNDING


# -- trims -------------------------------------------------------------------------
def test_caches_reading_recent_tokens_exactly_refuse_trims():
    # After a trim the new last tokens have no exact copies: such a cache would not
    # continue as a cold one, so it says it cannot be trimmed (mlx-lm then never trims
    # it) and refuses a trim asked for directly.
    keys, values, _ = window_kv(40)
    caches = [
        TurboQuantKVCache("turbo4", recent_exact=W),
        TurboQuantRotatingKVCache("turbo4", 64, recent_exact=W),
    ]
    for c in caches:
        c.update_and_fetch(keys, values)
    batches = [type(c).merge([copy.deepcopy(c)]) for c in caches]
    for c in caches + batches:
        assert not c.is_trimmable(), type(c).__name__
        with pytest.raises(ValueError, match="would not continue as a cold one"):
            c.trim(3)
        assert c.trim(0) == 0
    assert trim_prompt_cache(caches, 3) == 0 and caches[0].offset == 40
    # while W = 1 (the default) caches stay trimmable
    plain = TurboQuantKVCache("turbo4")
    plain.update_and_fetch(keys, values)
    assert plain.is_trimmable() and plain.trim(3) == 3


def test_the_servers_prompt_cache_reuses_a_prefix_without_trimming(tiny_model):
    # mlx-lm's LRUPromptCache (the server's): an untrimmable cache keeps the prefix
    # caches it would otherwise drop, and a new prompt continues the longest one it
    # extends instead of trimming a longer one: its answer is the cold one.
    model, _ = load_sliding(tiny_model, "llama")

    def cache():
        return make_prompt_cache(model, "turbo2", boundary_skip=0, recent_exact=W)

    shared, other = PROMPT[:30], [(11 * i + 1) % 250 + 5 for i in range(20)]
    lru = LRUPromptCache()
    prefix = cache()
    model(mx.array([shared]), cache=prefix)
    lru.insert_cache("m", shared, prefix)
    longer = copy.deepcopy(prefix)
    model(mx.array([other]), cache=longer)
    lru.insert_cache("m", shared + other, longer)
    reused, rest = lru.fetch_nearest_cache("m", PROMPT)
    assert rest == PROMPT[30:] and reused[0].offset == 30
    got = generate_tokens(model, rest, reused, 2048)
    cold = generate_tokens(model, PROMPT, cache(), 2048)
    assert got[0] == cold[0]
    assert (got[1] - cold[1]).abs().max().item() < ROUNDING


def test_caches_made_while_decoding_speculatively_take_no_window(monkeypatch):
    # What a command's caches get where nothing is typed: the defaults, or, while a
    # draft model decodes (--draft-model, or one the server loaded), no window and
    # the boundary layers that pay without one; what is typed stays.
    default = settings.Settings(parse_scheme("turbo4"))
    typed = settings.Settings(parse_scheme("turbo4"), boundary_skip=1, recent_exact=8)
    monkeypatch.setattr(settings, "speculative", False)
    assert default.cache_options() == {
        "boundary_skip": defaults.DEFAULT_BOUNDARY_SKIP,
        "recent_exact": defaults.DEFAULT_RECENT_EXACT,
    }
    monkeypatch.setattr(settings, "speculative", True)
    assert default.cache_options() == {"boundary_skip": 2, "recent_exact": 1}
    assert typed.cache_options() == {"boundary_skip": 1, "recent_exact": 8}


def test_the_server_notes_when_a_draft_model_is_loaded(monkeypatch):
    import mlx_lm.server

    from mlx_lm_turbo.attach import load_checking_models

    assert mlx_lm.server.ModelProvider.load.__wrapped__  # attached at import

    class Provider:
        draft_model = None

        def load(self, model, adapter=None, draft=None):
            self.draft_model = draft

    load = load_checking_models(Provider.load)
    provider = Provider()
    monkeypatch.setattr(settings, "speculative", False)
    monkeypatch.setattr(settings, "active", None)  # no scheme: no model to check
    load(provider, "model", None, "draft")
    assert settings.speculative
    load(provider, "model")
    assert not settings.speculative


def test_speculative_decoding_is_refused_by_mlx_lm(tiny_model):
    from mlx_lm.generate import speculative_generate_step

    model, _ = load(str(tiny_model("llama")))
    cache = make_prompt_cache(model, "turbo4", recent_exact=W)
    draft = make_prompt_cache(model, "none")
    with pytest.raises(ValueError, match="requires a trimmable prompt cache"):
        next(
            speculative_generate_step(
                mx.array(PROMPT), model, model, prompt_cache=cache + draft
            )
        )


# -- batches ------------------------------------------------------------------------
@pytest.mark.parametrize("step", [64, 16, 7])
def test_batch_rows_read_as_each_sequence_alone(step):
    # A right-padded prompt in step-token chunks (prepare, chunks, finalize), one row
    # joining with a history of its own, rows shorter and longer than the window, the
    # server's filter and extend in another order, then decoding: every output is the
    # sequence's alone (prefilled in one chunk) within float rounding.
    lengths, decode, history = [40, 3, 25, 30], 10, 20
    seqs = sequences(lengths, decode)
    singles = []
    for i, ((k, v, q), n) in enumerate(zip(seqs, lengths)):
        single = TurboQuantKVCache("turbo2", recent_exact=W)
        start = history if i == 3 else 0
        if start:
            single.update_and_fetch(k[:, :, :start], v[:, :, :start])
        view, _ = single.update_and_fetch(k[:, :, start:n], v[:, :, start:n])
        out = turbo_scaled_dot_product_attention(
            q[:, :, start:n], view, D**-0.5, "causal"
        )
        decoded = []
        for t in range(n, n + decode):
            view, _ = single.update_and_fetch(k[:, :, t : t + 1], v[:, :, t : t + 1])
            decoded.append(
                turbo_scaled_dot_product_attention(
                    q[:, :, t : t + 1], view, D**-0.5, None
                )
            )
        singles.append((out, decoded, single))
    joining = TurboQuantKVCache("turbo2", recent_exact=W)
    k, v, _ = seqs[3]
    joining.update_and_fetch(k[:, :, :history], v[:, :, :history])
    batch = TurboQuantKVCache.merge(
        [TurboQuantKVCache("turbo2", recent_exact=W) for _ in lengths[:3]] + [joining]
    )
    begin = [history if i == 3 else 0 for i in range(len(lengths))]
    todo = [n - b for n, b in zip(lengths, begin)]
    keys, values, queries = (
        right_padded([s[j][:, :, b:] for s, b in zip(seqs, begin)], todo)
        for j in range(3)
    )
    width = max(todo)
    batch.prepare(lengths=todo, right_padding=[width - n for n in todo])
    prompt_out = []
    for s in range(0, width, step):
        e = min(s + step, width)
        mask = batch.make_mask(e - s, return_array=True)
        view, _ = batch.update_and_fetch(keys[:, :, s:e], values[:, :, s:e])
        prompt_out.append(
            turbo_scaled_dot_product_attention(queries[:, :, s:e], view, D**-0.5, mask)
        )
    batch.finalize()
    prompt_out = mx.concatenate(prompt_out, axis=2)
    for row, ((expected, _, _), n) in enumerate(zip(singles, todo)):
        got = prompt_out[row : row + 1, :, :n]
        assert (got - expected).abs().max().item() <= FP16_ROUNDING, row
    other = copy.deepcopy(batch)
    batch.filter([0, 2])
    other.filter(mx.array([3, 1]))
    batch.extend(other)
    order = [0, 2, 3, 1]
    for t in range(decode):

        def pick(j):
            return mx.concatenate(
                [seqs[i][j][:, :, lengths[i] + t : lengths[i] + t + 1] for i in order]
            )

        mask = batch.make_mask(1, return_array=True)
        view, _ = batch.update_and_fetch(pick(0), pick(1))
        out = turbo_scaled_dot_product_attention(pick(2), view, D**-0.5, mask)
        for row, i in enumerate(order):
            error = (out[row : row + 1] - singles[i][1][t]).abs().max().item()
            assert error <= FP16_ROUNDING, (i, t)
    # each row leaves the batch with the single cache's recent copies
    for row, i in enumerate(order):
        extracted, single = batch.extract(row), singles[i][2]
        assert extracted.recent_exact == W and extracted.offset == single.offset
        for a, b in zip(extracted.recent, single.recent):
            assert mx.array_equal(a, b).item(), i


# -- what the copies cost ----------------------------------------------------------
def test_nbytes_counts_the_recent_copies():
    keys, values, _ = window_kv(40)
    sizes = {}
    for recent in (1, W):
        for cls, args in (
            (TurboQuantKVCache, ()),
            (TurboQuantRotatingKVCache, (64,)),
        ):
            cache = cls("turbo4", *args, recent_exact=recent)
            cache.update_and_fetch(keys, values)
            sizes[cls, recent] = cache.nbytes
            batch = cls.merge([cache])
            sizes[cls, recent, "batch"] = batch.nbytes
    copies = 2 * H * (W - 1) * D * keys.dtype.size  # keys and values
    for cls in (TurboQuantKVCache, TurboQuantRotatingKVCache):
        assert sizes[cls, W] - sizes[cls, 1] == copies
        assert sizes[cls, W, "batch"] - sizes[cls, 1, "batch"] == copies


def test_the_command_option_reaches_the_caches(tiny_model, monkeypatch):
    from helpers import run_main

    import mlx_lm_turbo.plugin.prompt_cache as prompt_cache

    made = []
    original = prompt_cache.make_prompt_cache
    monkeypatch.setattr(
        prompt_cache,
        "make_prompt_cache",
        lambda *a, **k: made.extend(original(*a, **k)) or made,
    )
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi there",
        "--max-tokens",
        2,
        "--kv-scheme",
        "turbo4",
        "--turbo-recent-exact",
        W,
    )
    assert status == 0
    compressed = [c for c in made if hasattr(c, "codec")]
    assert compressed and all(c.recent_exact == W for c in compressed)


@pytest.mark.parametrize("recent", [1, W])
def test_a_window_batch_decodes_in_place_as_each_sequence_alone(recent):
    # Rows past their sink tokens: each decode step writes the batch ring in place
    # (ring order), the recent tokens read exactly at their slots, as each single
    # window does.
    lengths, decode, max_size = [60, 45, 52], 20, 16
    seqs = sequences(lengths, decode)
    singles = []
    for (k, v, q), n in zip(seqs, lengths):
        single = TurboQuantRotatingKVCache("turbo2", max_size, recent_exact=recent)
        single.update_and_fetch(k[:, :, :n], v[:, :, :n])
        singles.append(
            sliding_outputs(single, [1] * decode, k[:, :, n:], v[:, :, n:], q[:, :, n:])
        )
    batch = TurboQuantRotatingKVCache.merge(
        [
            TurboQuantRotatingKVCache("turbo2", max_size, recent_exact=recent)
            for _ in lengths
        ]
    )
    width = max(lengths)
    batch.prepare(lengths=lengths, right_padding=[width - n for n in lengths])
    batch.update_and_fetch(
        *(right_padded([s[j] for s in seqs], lengths) for j in (0, 1))
    )
    batch.finalize()
    for step in range(decode):

        def pick(j):
            return mx.concatenate(
                [s[j][:, :, n + step : n + step + 1] for s, n in zip(seqs, lengths)]
            )

        assert not batch._decode_sees_sinks()  # so written in place
        mask = batch.make_mask(1, window_size=max_size, return_array=True)
        view, _ = batch.update_and_fetch(pick(0), pick(1))
        assert view.new_keys is None and view.sinks[0].shape[2] == recent
        out = turbo_scaled_dot_product_attention(pick(2), view, D**-0.5, mask)
        for row, expected in enumerate(singles):
            error = (out[row : row + 1] - expected[:, :, step : step + 1]).abs().max()
            assert error.item() <= FP16_ROUNDING, (row, step)
