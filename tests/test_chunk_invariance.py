"""A sequence's output does not depend on how its prompt was chunked, nor on what a
prompt cache reused (TurboKV's rule: each query reads the sink tokens and itself
exactly and every other key compressed; key statistics come from the sink tokens).
Sliding-window caches follow the same rule, a sink token being read exactly while it
is in the query's window."""

import copy

import mlx.core as mx
import pytest
from helpers import (
    FP16_ROUNDING,
    ON_CUDA,
    PROMPT,
    ROUNDING,
    chunked_outputs,
    generate_tokens,
    load_sliding,
    right_padded,
    window_kv,
)
from mlx_lm import load
from mlx_lm.generate import batch_generate
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache, trim_prompt_cache

from mlx_lm_turbo import TurboQuantRotatingKVCache, make_prompt_cache
from mlx_lm_turbo.attach.files import register_cache_classes
from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention

# Sliding-window models (tests/tiny_models.py: windows of 16 tokens, so PROMPT wraps
# them), in float32: gemma4_text's bfloat16 rounds too coarsely to compare (its
# uncompressed cache alone moves the log-probabilities by up to 0.05 with chunking).
SLIDING = ["gpt_oss", "gemma4_text"]

STEPS = 8
# On MLX-CUDA (float32 matmuls asked for, tests/conftest.py) other float32 kernels still
# round differently per shape; measured on the H200: up to 0.12 (gemma4_text's sliding
# windows, 16-token chunks) with the greedy tokens equal; before sliding windows kept
# sink tokens, chunking moved them by 0.3 to 6.6. CPU keeps ROUNDING.
GPU_ROUNDING = 0.2


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_generate_is_the_same_for_every_prefill_step_size(tiny_model, arch):
    model, _ = load(str(tiny_model(arch)))
    runs = {
        step: generate_tokens(
            model, PROMPT, make_prompt_cache(model, "turbo4", boundary_skip=0), step
        )
        for step in (64, 16, 7, 1)
    }
    tokens, logprobs = runs[64]
    for step, (t, p) in runs.items():
        assert t == tokens, step
        assert (p - logprobs).abs().max().item() < ROUNDING, step


@pytest.mark.parametrize("shared", [10, 50])  # shorter and longer than the sink tokens
def test_a_cache_reused_through_a_shared_prefix_equals_a_cold_one(tiny_model, shared):
    # The server's prompt cache: a cache of another prompt, trimmed to the shared
    # prefix (a deep copy), then the rest of this prompt (W 1: only such caches trim).
    model, _ = load(str(tiny_model("llama")))
    other = PROMPT[:shared] + [(11 * i + 1) % 250 + 5 for i in range(40)]
    warm = make_prompt_cache(model, "turbo4", recent_exact=1)
    generate_tokens(model, other, warm, 2048)
    reused = copy.deepcopy(warm)
    trim_prompt_cache(reused, reused[0].offset - shared)
    got = generate_tokens(model, PROMPT[shared:], reused, 2048)
    cold = generate_tokens(
        model, PROMPT, make_prompt_cache(model, "turbo4", recent_exact=1), 2048
    )
    assert got[0] == cold[0]
    assert (got[1] - cold[1]).abs().max().item() < ROUNDING


# recent_exact 8: caches that cannot be trimmed, so the server reuses prefixes untrimmed
@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("recent", ["1", "8"])
def test_a_server_answers_as_a_cold_server_after_any_history(tiny_model, recent):
    # The report: the next request reuses a prefix from the prompt cache that
    # ends inside a message (where the server's own prefill would not split the prompt);
    # its answer, down to the log-probabilities, must be the cold one. (turbo2 on every
    # layer: before the rule these moved by 0.07-0.08; now by one fp16 rounding.)
    from helpers import Server

    def ask(server, content, max_tokens):
        messages = [{"role": "user", "content": content}]
        reply = server.ask(
            "/v1/chat/completions",
            {
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "logprobs": True,
            },
        )
        return reply["choices"][0]["logprobs"]["content"]

    question = "Explain photosynthesis to a child of seven, briefly and kindly, in two sentences."
    answers = []
    for history in (
        [],
        [question[:40] + " the sea."],
        ["hi", question[:60] + " at length."],
    ):
        server = Server(
            tiny_model("llama"),
            *("--kv-scheme", "turbo2", "--turbo-boundary-skip", "0"),
            *("--turbo-recent-exact", recent),
        )
        try:
            for earlier in history:
                ask(server, earlier, 6)
            content = ask(server, question, 12)
            answers.append(
                ([t["id"] for t in content], mx.array([t["logprob"] for t in content]))
            )
        finally:
            server.stop()
    cold_tokens, cold_logprobs = answers[0]
    for tokens, logprobs in answers[1:]:
        assert tokens == cold_tokens
        assert (logprobs - cold_logprobs).abs().max().item() < ROUNDING


@pytest.fixture
def experts_unsorted_on_cuda(monkeypatch):
    """GPT-OSS's experts without ``mx.gather_mm``'s ``sorted_indices`` hint on MLX-CUDA.

    mlx-lm sorts a call's (token, expert) pairs from 64 on and says so to gather_mm.
    On the H200 (MLX-CUDA 0.32.4), in some processes, that sorted gather_mm gave the
    down projection of a 40-token prefix wrong outputs (off by up to 1.3) from inputs
    equal to the CPU's, with our kernels off too; the same call without the hint gave
    the CPU's (benchmarks/results/reuse_failure_h200_818b257.md). The hint only lets
    MLX skip work, so dropping it computes the same thing.
    """
    if ON_CUDA:
        gather_mm = mx.gather_mm

        def unsorted(*args, sorted_indices=False, **kwargs):
            return gather_mm(*args, **kwargs)

        monkeypatch.setattr(mx, "gather_mm", unsorted)


@pytest.mark.usefixtures("experts_unsorted_on_cuda")
@pytest.mark.parametrize("arch", SLIDING)
def test_sliding_window_models_generate_the_same_for_every_prefill_step_size(
    tiny_model, arch
):
    # Before sliding windows kept sink tokens, their key statistics came from the
    # first chunk: the log-probabilities moved by 0.3 to 6.6 with the step size.
    model, _ = load_sliding(tiny_model, arch)
    runs = {
        step: generate_tokens(
            model, PROMPT, make_prompt_cache(model, "turbo4", boundary_skip=0), step
        )
        for step in (64, 16, 8, 7, 1)
    }
    tokens, logprobs = runs[64]
    bound = GPU_ROUNDING if ON_CUDA else ROUNDING
    for step, (t, p) in runs.items():
        assert t == tokens, step
        assert (p - logprobs).abs().max().item() < bound, step


@pytest.mark.usefixtures("experts_unsorted_on_cuda")
@pytest.mark.parametrize("shared", [10, 40])  # inside / past the window's sink tokens
def test_a_sliding_window_cache_reused_or_reloaded_equals_a_cold_one(
    tiny_model, tmp_path, shared
):
    # The prompt cache of a sliding-window model is reused as it is (a window that
    # has moved cannot be trimmed): a copy of the prefix's cache, or one saved and
    # loaded again, then the rest of the prompt.
    register_cache_classes()
    model, _ = load_sliding(tiny_model, "gpt_oss")
    prefix = make_prompt_cache(model, "turbo4", boundary_skip=0)
    model(mx.array([PROMPT[:shared]]), cache=prefix)
    save_prompt_cache(str(tmp_path / "prefix.safetensors"), prefix)
    cold = generate_tokens(
        model, PROMPT, make_prompt_cache(model, "turbo4", boundary_skip=0), 2048
    )
    for reused in (
        copy.deepcopy(prefix),
        load_prompt_cache(str(tmp_path / "prefix.safetensors")),
    ):
        got = generate_tokens(model, PROMPT[shared:], reused, 2048)
        assert got[0] == cold[0]
        assert (got[1] - cold[1]).abs().max().item() < ROUNDING


@pytest.mark.usefixtures("experts_unsorted_on_cuda")
@pytest.mark.parametrize("recent", [1, 8])  # recent_exact (test_recent_exact.py)
def test_sliding_window_batches_generate_the_same_for_every_prefill_step_size(
    tiny_model, recent
):
    # mlx-lm's batch generator: the batch ring keeps each row's sink tokens (and
    # recent tokens).
    model, tokenizer = load_sliding(tiny_model, "gpt_oss")
    prompts = [PROMPT, PROMPT[:9], PROMPT[5:30]]  # past, inside, around the sinks

    def generate(step):
        out = batch_generate(
            model,
            tokenizer,
            prompts,
            prompt_caches=[
                make_prompt_cache(model, "turbo4", boundary_skip=0, recent_exact=recent)
                for _ in prompts
            ],
            max_tokens=STEPS,
            prefill_step_size=step,
            return_token_ids=True,
            return_logprobs=True,
        )
        return out.token_ids, mx.array(out.logprobs)

    tokens, logprobs = generate(64)
    for step in (16, 7):
        t, p = generate(step)
        assert t == tokens, step
        assert (p - logprobs).abs().max().item() < ROUNDING, step
    # and each row answers as the sequence alone
    for prompt, row in zip(prompts, tokens):
        cache = make_prompt_cache(model, "turbo4", boundary_skip=0, recent_exact=recent)
        assert generate_tokens(model, prompt, cache, 64)[0] == row


# -- the sliding-window caches themselves, bit for bit on CPU --------------------------
H, D, HQ, WINDOW = 2, 64, 4, 16
BIT_EXACT = mx.default_device().type == mx.cpu


def same(a, b):
    if BIT_EXACT:
        return mx.array_equal(a, b).item()
    return mx.allclose(a.astype(mx.float32), b.astype(mx.float32), atol=5e-3).item()


def attend(cache, keys, values, queries, start, end):
    """Feed tokens [start, end) as one chunk; the chunk's attention output."""
    mask = cache.make_mask(end - start, window_size=cache.max_size, return_array=True)
    view, _ = cache.update_and_fetch(keys[:, :, start:end], values[:, :, start:end])
    return turbo_scaled_dot_product_attention(
        queries[:, :, start:end], view, D**-0.5, mask
    )


def prefill_then_decode(chunks, decode, keep=0, max_size=WINDOW):
    total = sum(chunks)
    keys, values, queries = window_kv(total + decode)
    cache = TurboQuantRotatingKVCache("turbo4", max_size, keep)
    start, prompt_out = 0, []
    for n in chunks:
        prompt_out.append(attend(cache, keys, values, queries, start, start + n))
        start += n
    decoded = [
        attend(cache, keys, values, queries, t, t + 1)
        for t in range(total, total + decode)
    ]
    return cache, mx.concatenate(prompt_out, axis=2), mx.concatenate(decoded, axis=2)


CHUNKINGS = [[70], [8, 62], [16, 16, 16, 16, 6], [7] * 10, [1] * 70, [3, 1, 30, 1, 35]]


@pytest.mark.parametrize("keep", [0, 4])
def test_a_sliding_window_measures_and_reads_the_same_whatever_the_chunking(keep):
    # The same keys and values, chunked differently: the same key statistics, the same
    # compressed window, the same outputs for every prompt token and decode step
    # (wrapping the ring). Before, the statistics came from the first chunk.
    runs = [prefill_then_decode(c, 20, keep) for c in CHUNKINGS]
    cache, prompt_out, decoded = runs[0]
    want = [cache._temporal_order(a) for a in cache._stored_slice()]
    for (c, p, d), chunks in zip(runs, CHUNKINGS):
        assert same(c.codec.key_mean, cache.codec.key_mean), chunks
        # (kept slots hold sink tokens: read exactly, their compressed copies, made
        # before the statistics in some chunkings, are never read)
        for a, b in zip([c._temporal_order(a) for a in c._stored_slice()], want):
            assert mx.array_equal(a[:, :, keep:], b[:, :, keep:]).item(), chunks
        if keep == 0:  # kept slots: mlx-lm's own window differs with the chunking
            # Every query reads the same keys the same way; only the order the ring
            # hands them in can differ (one token at a time wraps it elsewhere).
            assert mx.allclose(p, prompt_out, atol=2e-3).item(), chunks
            assert mx.allclose(d, decoded, atol=2e-3).item(), chunks
            if chunks[-1] > 1:  # the same ring layout once decoding: bit for bit
                assert same(d, decoded), chunks
    assert (cache.sinks is None) == (keep == 0)  # let go past the window, unless kept


def test_a_sliding_window_trimmed_saved_and_reloaded_continues_like_a_cold_one(
    tmp_path,
):
    register_cache_classes()
    cold, _, decoded = prefill_then_decode([23], 6, max_size=32)
    keys, values, queries = window_kv(29)
    cache = TurboQuantRotatingKVCache("turbo4", 32)
    attend(cache, keys, values, queries, 0, 20)
    # trimmed into the sink tokens (the statistics go with them), refilled
    assert cache.is_trimmable() and cache.trim(8) == 8
    assert cache.codec.key_mean is None and cache._sink_count() == 12
    attend(cache, keys, values, queries, 12, 23)
    save_prompt_cache(str(tmp_path / "c.safetensors"), [cache])
    (loaded,) = load_prompt_cache(str(tmp_path / "c.safetensors"))
    got = mx.concatenate(
        [attend(loaded, keys, values, queries, t, t + 1) for t in range(23, 29)],
        axis=2,
    )
    assert same(loaded.codec.key_mean, cold.codec.key_mean)
    assert same(got, decoded)


@pytest.mark.parametrize("recent", [1, 8])  # recent_exact (test_recent_exact.py)
@pytest.mark.parametrize("step", [64, 16, 7])
def test_a_sliding_window_batch_reads_as_each_sequence_alone_whatever_the_chunking(
    step, recent
):
    # As mlx-lm's batch generator feeds it: a right-padded prompt in step-token chunks
    # (prepare, chunks, finalize), then decoding; rows past, around and inside the
    # sink tokens, one joining with a history of its own. Every prompt token's and
    # decode step's output is the sequence's alone (one chunk) within float rounding.
    # Before, each row's statistics came from its first chunk (and in the view they
    # still would without the sink tokens of the current chunk).
    lengths, decode, history = [40, 9, 25, 30], 24, 20
    data = [window_kv(n + decode, seed=i) for i, n in enumerate(lengths)]
    singles = []
    for i, ((k, v, q), n) in enumerate(zip(data, lengths)):
        single = TurboQuantRotatingKVCache("turbo4", WINDOW, recent_exact=recent)
        start = history if i == 3 else 0
        if start:
            single.update_and_fetch(k[:, :, :start], v[:, :, :start])
        out = attend(single, k, v, q, start, n)
        prompted = copy.deepcopy(single)
        decoded = [attend(single, k, v, q, t, t + 1) for t in range(n, n + decode)]
        singles.append((out, decoded, prompted, single))
    joining = TurboQuantRotatingKVCache("turbo4", WINDOW, recent_exact=recent)
    k, v, _ = data[3]
    joining.update_and_fetch(k[:, :, :history], v[:, :, :history])
    batch = TurboQuantRotatingKVCache.merge(
        [
            TurboQuantRotatingKVCache("turbo4", WINDOW, recent_exact=recent)
            for _ in lengths[:3]
        ]
        + [joining]
    )
    todo = [n - (history if i == 3 else 0) for i, n in enumerate(lengths)]
    begin = [history if i == 3 else 0 for i in range(len(lengths))]
    keys, values, queries = (
        right_padded([d[j][:, :, b:] for d, b in zip(data, begin)], todo)
        for j in range(3)
    )
    width = max(todo)
    batch.prepare(lengths=todo, right_padding=[width - n for n in todo])
    prompt_out = []
    for s in range(0, width, step):
        prompt_out.append(attend(batch, keys, values, queries, s, min(s + step, width)))
    batch.finalize()
    prompt_out = mx.concatenate(prompt_out, axis=2)
    for row, ((expected, _, prompted, _), n) in enumerate(zip(singles, todo)):
        got = prompt_out[row : row + 1, :, :n]
        assert (got - expected).abs().max().item() <= FP16_ROUNDING, row
        # each row leaves the batch with the single cache's sink tokens and statistics
        extracted = batch.extract(row)
        assert extracted.offset == prompted.offset
        mean, want = extracted.codec.key_mean, prompted.codec.key_mean
        assert (mean is None) == (want is None) == (prompted.offset < 16), row
        assert mean is None or same(mean, want), row
        for a, b in zip(extracted.sinks or (), prompted.sinks or ()):
            assert mx.array_equal(a, b).item(), row
        assert extracted._sink_count() == prompted._sink_count(), row
        for a, b in zip(extracted.recent or (), prompted.recent or ()):
            assert mx.array_equal(a, b).item(), row
    # The server's split and join: rows filtered out of copies, joined in another order.
    other = copy.deepcopy(batch)
    batch.filter([0, 2])
    other.filter(mx.array([3, 1]))
    batch.extend(other)
    order = [0, 2, 3, 1]
    for t in range(decode):

        def pick(j):
            return mx.concatenate(
                [data[i][j][:, :, lengths[i] + t : lengths[i] + t + 1] for i in order]
            )

        mask = batch.make_mask(1, window_size=WINDOW, return_array=True)
        view, _ = batch.update_and_fetch(pick(0), pick(1))
        out = turbo_scaled_dot_product_attention(pick(2), view, D**-0.5, mask)
        for row, i in enumerate(order):
            error = (out[row : row + 1] - singles[i][1][t]).abs().max().item()
            assert error <= FP16_ROUNDING, (i, t)
    assert batch.sinks is None  # every row past its window: let go
    for row, i in enumerate(order):
        extracted = batch.extract(row)
        assert extracted.offset == lengths[i] + decode and extracted.sinks is None
        for a, b in zip(extracted.recent or (), singles[i][3].recent or ()):
            assert mx.array_equal(a, b).item(), i


@pytest.mark.parametrize("recent", [1, 8])  # recent_exact (test_recent_exact.py)
@pytest.mark.parametrize("sliding", [False, True])
def test_the_uncompressed_start_rule(sliding, recent):
    # The first N tokens of an uncompressed start N are kept exact for good (as sink
    # tokens): a query before N reads every key exactly and a later one reads them
    # exactly, wherever the chunk that reaches N starts. Before, for N above the 16
    # sink tokens the outputs after N depended on that boundary (failed at N = 40).
    from mlx_lm_turbo import TurboQuantKVCache

    def make(start):
        if sliding:  # a window wider than the prompt: the rule, not the window, decides
            return TurboQuantRotatingKVCache(
                "turbo4", 128, uncompressed_start=start, recent_exact=recent
            )
        return TurboQuantKVCache(
            "turbo4", uncompressed_start=start, recent_exact=recent
        )

    keys, values, queries = window_kv(70)
    exact = mx.fast.scaled_dot_product_attention(
        queries, keys, values, scale=D**-0.5, mask="causal"
    )
    for start in (10, 16, 40):
        reference = chunked_outputs(make(start), [70], keys, values, queries)
        for chunks in ([70], [8, 62], [32, 38], [7] * 10, [1] * 20 + [50]):
            got = chunked_outputs(make(start), chunks, keys, values, queries)
            assert (got - reference).abs().max().item() <= FP16_ROUNDING, (
                start,
                chunks,
            )
        # queries before the start read every key exactly
        first = max(start, 16)
        assert (got - exact)[:, :, :first].abs().max().item() <= FP16_ROUNDING
    # and later ones read the first 40 exactly: closer to exact attention than N = 16
    error = {
        start: (chunked_outputs(make(start), [70], keys, values, queries) - exact)[
            :, :, 40:
        ]
        .abs()
        .mean()
        .item()
        for start in (16, 40)
    }
    assert error[40] < error[16]
    assert make(40).sink_tokens == 40 and make(10).sink_tokens == 16
