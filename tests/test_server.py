"""mlx_lm.server --kv-scheme: batched serving under concurrent load (real HTTP on 127.0.0.1)."""

import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import tiny_models
from helpers import LLAMA_HD16, Server, chat, count_merges, text_of
from mlx_lm import load, stream_generate
from mlx_lm.generate import batch_generate
from tiny_models import ARCHITECTURES

import mlx_lm_turbo.settings as settings
from mlx_lm_turbo import make_prompt_cache, parse_scheme

pytestmark = pytest.mark.slow  # subprocesses: the quick loop is pytest -m 'not slow'


def test_batch_generate_with_turbo_caches_matches_one_at_a_time(
    tiny_model, monkeypatch
):
    from mlx_lm_turbo.cache.kv_cache import TurboQuantBatchKVCache

    model, tokenizer = load(str(tiny_model("llama")))
    monkeypatch.setattr(
        settings, "active", settings.Settings(parse_scheme("turbo4"), boundary_skip=1)
    )
    merged = count_merges(monkeypatch, TurboQuantBatchKVCache)
    prompts = [
        tokenizer.encode(t)
        for t in (
            "hello there",
            "the quick brown fox jumps over",
            "a",
            "hello hello hello hello hello hello hello",
        )
    ]
    batched = batch_generate(model, tokenizer, prompts, max_tokens=10).texts
    assert merged and max(merged) == len(prompts)  # really one batch of four
    one_at_a_time = [
        "".join(r.text for r in stream_generate(model, tokenizer, p, max_tokens=10))
        for p in prompts
    ]
    assert batched == one_at_a_time


def cold_answer(model, tokenizer, request):
    """The request answered alone by a fresh process: its own new caches, nothing reused."""
    prompt = tokenizer.apply_chat_template(
        request["messages"], add_generation_prompt=True
    )
    cache = make_prompt_cache(model, "turbo4")
    return "".join(
        r.text
        for r in stream_generate(
            model,
            tokenizer,
            prompt,
            max_tokens=request["max_tokens"],
            prompt_cache=cache,
        )
    )


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_concurrent_load_is_batched_and_matches_cold_single_requests(arch, tiny_model):
    server = Server(tiny_model(arch), "--kv-scheme", "turbo4")
    shared = "Once upon a time in a small village by the sea "
    # 16 requests from 8 clients, prompts of about 70 tokens: batches form (asserted
    # below) at a fraction of the suite time of longer prompts or more requests, the
    # suite's slowest test over nine architectures on a CPU that runs a tiny model's
    # prefill at a few hundred tokens a second (float16 matmuls).
    requests = [
        chat(shared + f"story {i % 5}" + " more" * (i % 7), max_tokens=6 + i % 4)
        for i in range(16)
    ]
    results, errors = {}, []

    def client(worker):
        for i in range(worker, len(requests), 8):
            try:
                results[i] = text_of(server.ask("/v1/chat/completions", requests[i]))
            except Exception as error:  # collected, asserted below
                errors.append(repr(error))

    try:
        threads = [threading.Thread(target=client, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
            time.sleep(0.05)  # the stdlib HTTP server listens with a backlog of 5
        for t in threads:
            t.join(timeout=300)
    finally:
        log = server.stop()
    assert not errors, errors[:3]
    assert len(results) == len(requests)
    model, tokenizer = load(str(tiny_model(arch)))
    cold = {
        i: cold_answer(model, tokenizer, requests[i])
        for i in range(0, len(requests), 4)
    }
    assert {i: results[i] for i in cold} == cold
    batch_sizes = [
        int(line.split("batching ")[1].split()[0])
        for line in log.splitlines()
        if "batching " in line
    ]
    assert batch_sizes and max(batch_sizes) >= 2, log[-2000:]


def test_streaming_and_completions_endpoints(tiny_model):
    server = Server(tiny_model("llama"), "--kv-scheme", "turbo3")
    try:
        plain = server.ask("/v1/chat/completions", chat("hello"))
        streamed = server.ask("/v1/chat/completions", chat("hello"), stream=True)
        completion = server.ask(
            "/v1/completions",
            {"prompt": "hello there", "max_tokens": 5, "temperature": 0.0},
        )
        bad = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/v1/chat/completions",
            data=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(bad, timeout=30)
        again = server.ask("/v1/chat/completions", chat("hello"))  # still serving
    finally:
        server.stop()
    streamed_text = "".join(
        c["choices"][0]["delta"].get("content", "") or ""
        for c in streamed
        if c.get("choices")
    )
    assert streamed_text == text_of(plain) == text_of(again)
    assert completion["choices"][0]["text"]


def test_a_request_naming_a_draft_model_decodes_speculatively(tiny_model):
    # Speculative decoding trims its caches, which the default window forbids: caches
    # made while the request's draft model is loaded read only the query itself exactly
    # (mlx-lm would refuse a window's caches: "requires a trimmable prompt cache").
    model = str(tiny_model("llama"))
    server = Server(model, "--kv-scheme", "turbo4")
    try:
        drafted = server.ask(
            "/v1/chat/completions", {**chat("hello there"), "draft_model": model}
        )
        plain = server.ask("/v1/chat/completions", chat("hello there"))
    finally:
        log = server.stop()
    assert "Traceback" not in log and "trimmable" not in log, log[-2000:]
    assert text_of(drafted) and text_of(plain)


def test_prompt_cache_reuse_matches_a_cold_server(tiny_model):
    """Multi-turn (a prefix hit) and an edited last turn (a cached prefix the server
    continues untrimmed: the default window's caches cannot be trimmed).

    Warm and cold need not agree bit for bit by design: a cold prompt attends exactly to
    itself within its prefill chunk, a warm one to the compressed cached prefix; here
    (turbo4, greedy) they agree token for token."""
    turn1 = [
        {"role": "user", "content": "Tell me about the sea and the small village."}
    ]
    warm = Server(tiny_model("llama"), "--kv-scheme", "turbo4")
    try:
        reply1 = text_of(
            warm.ask(
                "/v1/chat/completions",
                {"messages": turn1, "max_tokens": 8, "temperature": 0.0},
            )
        )
        turn2 = turn1 + [
            {"role": "assistant", "content": reply1},
            {"role": "user", "content": "And then?"},
        ]
        edited = turn1 + [
            {"role": "assistant", "content": reply1},
            {"role": "user", "content": "Why?"},
        ]
        warm_replies = [
            text_of(
                warm.ask(
                    "/v1/chat/completions",
                    {"messages": m, "max_tokens": 8, "temperature": 0.0},
                )
            )
            for m in (turn2, edited)
        ]
    finally:
        log = warm.stop()
    cold_replies = []
    for messages in (turn2, edited):
        cold = Server(tiny_model("llama"), "--kv-scheme", "turbo4")
        try:
            cold_replies.append(
                text_of(
                    cold.ask(
                        "/v1/chat/completions",
                        {"messages": messages, "max_tokens": 8, "temperature": 0.0},
                    )
                )
            )
        finally:
            cold.stop()
    assert warm_replies == cold_replies
    assert (
        "Prompt Cache: 1 sequences" in log or "Prompt Cache: 2 sequences" in log
    )  # the LRU held turn 1


# mlx_lm.server with its first batch step failing: an error inside the generation loop
# that no check foresaw.
SERVER_WITH_A_FAULT = """
import sys
from mlx_lm.generate import BatchGenerator
step = BatchGenerator.next
def next(self, *args, **kwargs):
    if not getattr(BatchGenerator, "failed", False):
        BatchGenerator.failed = True
        raise RuntimeError("injected fault")
    return step(self, *args, **kwargs)
BatchGenerator.next = next
from mlx_lm.server import main
sys.exit(main())
"""


def test_a_request_that_fails_leaves_the_server_serving_everyone_else(
    tiny_model, monkeypatch
):

    monkeypatch.setitem(tiny_models.CONFIGS, "llama_hd16", LLAMA_HD16)
    unservable = str(tiny_model("llama_hd16"))
    server = Server(
        tiny_model("llama"),
        "--kv-scheme",
        "turbo4",
        command=(sys.executable, "-c", SERVER_WITH_A_FAULT),
    )
    try:
        with pytest.raises(OSError):  # the request in the failing step fails
            server.ask("/v1/chat/completions", chat("hello there"))
        model = server.refusal({**chat("hello"), "model": unservable})
        draft = server.refusal({**chat("hello"), "draft_model": unservable})
        served = server.ask("/v1/chat/completions", chat("hello there"))
    finally:
        log = server.stop()
    assert model[0] == draft[0] == 404, log[-3000:]
    assert f"cannot serve {unservable}" in model[1]
    assert "no codebook for head_dim=16" in model[1]
    assert f"draft model {unservable}" in draft[1]
    assert "no codebook for head_dim=16" in draft[1]
    assert text_of(served)
    assert "generation thread died" not in log
