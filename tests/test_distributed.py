"""Compressed caches under mx.distributed (issue 15): a pipeline rank plans by the
model's layer numbers, as one process does."""

import socket
import time
from dataclasses import replace

import mlx.core as mx
import pytest
from mlx_lm.utils import _get_classes
from tiny_models import CONFIGS, VOCAB

from mlx_lm_turbo import make_prompt_cache, plan

QWEN2 = dict(
    model_type="qwen2",
    hidden_size=64,
    num_hidden_layers=8,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    rms_norm_eps=1e-6,
    vocab_size=VOCAB,
    tie_word_embeddings=True,
)


class FakeGroup:
    """What ``PipelineMixin.pipeline`` reads of a group: its rank and size."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


def build(config, pipeline=None):
    """A model of ``config`` (unevaluated random weights), pipelined as ``sharded_load`` does."""
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    if pipeline is not None:
        model.model.pipeline(FakeGroup(*pipeline))
    return model


def rank_share(whole, model):
    """The one-process plan cut to the layers a pipeline rank holds, numbered as its caches are."""
    start = model.model.start_idx
    return [
        replace(p, index=p.layer - start) for p in whole[start : model.model.end_idx]
    ]


@pytest.fixture
def overrides(tmp_path, monkeypatch):
    from mlx_lm_turbo.plugin.registry import registry

    def write(text):
        path = tmp_path / "overrides.toml"
        path.write_text(text)
        monkeypatch.setenv("MLX_LM_TURBO_OVERRIDES", str(path))
        registry.cache_clear()

    yield write
    monkeypatch.delenv("MLX_LM_TURBO_OVERRIDES", raising=False)
    registry.cache_clear()


@pytest.mark.parametrize(
    "name, config, size",
    [
        ("qwen2", QWEN2, 2),
        ("qwen2", QWEN2, 3),
        ("qwen3_5", CONFIGS["qwen3_5"], 2),
        ("qwen3_5", CONFIGS["qwen3_5"], 3),
    ],
)
def test_pipeline_rank_plan_is_the_one_process_plan_restricted_to_its_layers(
    name, config, size
):
    config = {"vocab_size": VOCAB, **config}
    _, _, whole, _ = plan(build(config), "turbo4")
    assert (
        [p.index for p in whole] == [p.layer for p in whole] == list(range(len(whole)))
    )
    held = []
    for rank in range(size):
        model = build(config, pipeline=(rank, size))
        _, _, layers, _ = plan(model, "turbo4")
        assert layers == rank_share(whole, model)
        held += [p.layer for p in layers]
    assert sorted(held) == list(range(len(whole)))


def test_eight_layers_over_two_ranks_protect_layers_0_1_6_7_only():
    """The issue's case: each rank used to protect its own first and last two layers."""
    boundary = {}
    for rank in range(2):
        model = build(QWEN2, pipeline=(rank, 2))
        _, _, layers, _ = plan(model, "turbo4", boundary_skip=2)
        boundary.update({p.layer: p.scheme.name for p in layers})
    assert boundary == {
        0: "turbo8",
        1: "turbo8",
        2: "turbo4",
        3: "turbo4",
        4: "turbo4",
        5: "turbo4",
        6: "turbo8",
        7: "turbo8",
    }


def test_pipeline_caches_take_the_model_layer_as_rotation_seed():
    model = build(QWEN2, pipeline=(0, 2))  # rank 0 holds the last layers, 4-7
    caches = make_prompt_cache(model, "turbo4", boundary_skip=2)
    assert [c.layer for c in caches] == [4, 5, 6, 7]
    assert [c.scheme.name for c in caches] == ["turbo4", "turbo4", "turbo8", "turbo8"]


def test_pipeline_overrides_name_model_layers(overrides):
    overrides(
        '[[override]]\nmodel_type = "qwen2"\nlayer_schemes = { 5 = "turbo3", 2 = "turbo2" }\n'
    )
    schemes = {}
    for rank in range(2):
        _, _, layers, _ = plan(build(QWEN2, pipeline=(rank, 2)), "turbo4")
        schemes.update({p.layer: (p.scheme.name, p.reason) for p in layers})
    assert schemes[5] == ("turbo3", "per-layer override") and schemes[2] == (
        "turbo2",
        "per-layer override",
    )
    # An entry past the model's last layer is refused on every rank, not only where it would fall.
    from mlx_lm_turbo.errors import UsageError

    overrides('[[override]]\nmodel_type = "qwen2"\nlayer_schemes = { 8 = "turbo3" }\n')
    with pytest.raises(UsageError, match="whose caches are entries 0-7"):
        plan(build(QWEN2, pipeline=(1, 2)), "turbo4")


def test_planning_a_pipeline_rank_leaves_the_random_key_as_it_was():
    """The layout comes from an unloaded copy of the model, whose init must not shift sampling."""
    model = build(QWEN2, pipeline=(1, 2))
    mx.random.seed(7)
    expected = mx.random.uniform(shape=(4,))
    mx.random.seed(7)
    plan(model, "turbo4")
    assert mx.array_equal(mx.random.uniform(shape=(4,)), expected)


def free_port_pair():
    """A port p with p and p + 1 free on 127.0.0.1 (the ring backend listens on one per rank)."""
    import random
    import socket

    for _ in range(50):
        port = random.randrange(20000, 60000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    pytest.fail("no two adjacent free ports on 127.0.0.1")


def shardable_model_dir(name, tiny_model, tiny_tokenizer_dir, root):
    """A model directory ``sharded_load`` can pipeline: weights plus their index."""
    import json
    import shutil

    from mlx.utils import tree_flatten

    out = root / name
    if name == "qwen2":  # not among tests/tiny_models.py's: 8 plain attention layers
        out.mkdir()
        mx.random.seed(2)
        model = build(QWEN2)
        model.set_dtype(mx.float16)
        mx.save_safetensors(
            str(out / "model.safetensors"), dict(tree_flatten(model.parameters()))
        )
        (out / "config.json").write_text(json.dumps(QWEN2))
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tiny_tokenizer_dir / f, out / f)
    else:
        shutil.copytree(tiny_model(name), out)
    weights = mx.load(str(out / "model.safetensors"))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: "model.safetensors" for k in weights}})
    )
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, sharding, turbo8_layers",
    [
        ("qwen2", "pipeline", [0, 1, 6, 7]),
        ("qwen3_5", "pipeline", [3, 7]),
        ("llama", "tensor", [0, 1, 4, 5]),
    ],
)
def test_two_local_processes_match_one_process(
    name, sharding, turbo8_layers, tiny_model, tiny_tokenizer_dir, tmp_path
):
    """mlx.launch, ring backend, 2 ranks on 127.0.0.1: each rank's plan is the one-process
    plan cut to its layers, its cache holds its share of the one-process bytes after the
    same prefill, its logits are the one-process ones (pipeline: exactly), and rank 0
    alone prints the notice."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    model_dir = shardable_model_dir(
        name, tiny_model, Path(tiny_tokenizer_dir), tmp_path
    )
    launch = Path(sys.executable).parent / "mlx.launch"
    script = Path(__file__).parent / "distributed_check.py"
    result = subprocess.run(
        [
            str(launch),
            "-n",
            "2",
            "--backend",
            "ring",
            "--hosts",
            "127.0.0.1",
            "--starting-port",
            str(free_port_pair()),
            "--python",
            sys.executable,
            "--",
            str(script),
            str(model_dir),
            sharding,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    ranks = sorted(
        (
            json.loads(line.split("RESULT ", 1)[1])
            for line in result.stdout.splitlines()
            if "RESULT " in line
        ),
        key=lambda r: r["rank"],
    )
    # mlx.launch exits 0 even when a rank fails: each rank must have reported.
    assert [r["rank"] for r in ranks] == [0, 1], (
        result.stdout[-2000:] + result.stderr[-3000:]
    )
    assert all(r["size"] == 2 for r in ranks)
    schemes = {}
    for r in ranks:
        assert r["plan_matches"], r
        start = r["layers"][0]
        assert [s for s in r["seeds"] if s is not None] == [
            int(i) for i, s in r["schemes"].items() if s
        ]
        assert all(s is None or s >= start for s in r["seeds"])
        schemes.update({int(i): s for i, s in r["schemes"].items()})
    if sharding == "pipeline":
        # Rank 1 runs the first layers, rank 0 the last ones.
        assert ranks[1]["layers"] == [0, 4] and ranks[0]["layers"] == [4, 8]
        for r in ranks:
            assert r["rank_bytes"] == r["share_bytes"], r
            # The same operations on the same inputs, split over two processes.
            assert r["max_logit_difference"] == 0.0, r
        assert sum(sum(r["rank_bytes"]) for r in ranks) == ranks[0]["whole_bytes"]
    else:
        for r in ranks:
            assert r["layers"] == [0, 6]
            assert [2 * b for b in r["rank_bytes"]] == r["share_bytes"], (
                r
            )  # one of the 2 KV heads
            # Measured 0.0093 (0.0049 with mlx-lm's caches): the sharded o_proj / MLP sums
            # round differently; the bound leaves room for that noise, not for a wrong head.
            assert r["max_logit_difference"] < 0.05, r
            # That noise flips codes at quantization boundaries, layer after layer
            # (benchmarks/results/sharded_smollm2_cpu.md), so a tensor run differs from
            # one process by part of what another rotation seed gives, never more.
            assert (
                r["max_logit_difference"] < r["max_logit_difference_other_seed"] / 2
            ), r
    assert sorted(i for i, s in schemes.items() if s == "turbo8") == turbo8_layers
    assert all(
        s in (None, "turbo4") for i, s in schemes.items() if i not in turbo8_layers
    )
    notices = (result.stdout + result.stderr).count(f"[mlx-lm-turbo] {name}: KV caches")
    assert notices == 1, result.stderr[-2000:]  # rank 0 alone


@pytest.mark.parametrize("uncompressed_start", [0, 100])
def test_a_pipeline_stage_can_tie_its_send_to_the_last_cache_keys(uncompressed_start):
    """mlx-lm's pipelined models run ``cache[-1].keys = mx.depends(cache[-1].keys, h)``
    on every rank but rank 0; the cache must take it and read as before."""
    from mlx_lm_turbo.cache.kv_cache import TurboQuantKVCache

    cache = TurboQuantKVCache("turbo4", uncompressed_start=uncompressed_start)
    keys, values = (
        mx.random.normal((1, 2, 20, 64), key=mx.random.key(i)) for i in (1, 2)
    )
    cache.update_and_fetch(keys, values)
    before = [mx.array(a) for a in cache.state if isinstance(a, mx.array)]
    cache.keys = mx.depends(cache.keys, mx.ones((3,)))
    after = [a for a in cache.state if isinstance(a, mx.array)]
    assert len(before) == len(after) and all(
        mx.array_equal(a, b) for a, b in zip(before, after)
    )
    assert cache.offset == 20


@pytest.mark.parametrize("scheme", ["turbo4", "turbo3", "turbo8"])
def test_a_heads_codes_do_not_depend_on_the_heads_sharing_its_cache(scheme):
    """A tensor rank's cache holds some of a layer's KV heads: the rotation (seeded by
    layer and head dim), the key statistics and the sink tokens are per head, so each
    head stores the same codes as in the one-process cache holding every head."""
    from mlx_lm_turbo.cache.kv_cache import TurboQuantKVCache

    keys, values = (
        mx.random.normal((1, 3, 40, 64), key=mx.random.key(i)) + 0.5 * i for i in (1, 2)
    )
    step = (
        mx.random.normal((1, 3, 1, 64), key=mx.random.key(3)),
        mx.random.normal((1, 3, 1, 64), key=mx.random.key(4)),
    )
    whole = TurboQuantKVCache(scheme, layer=5)
    whole.update_and_fetch(keys, values)
    whole.update_and_fetch(*step)
    for head in range(3):
        one = TurboQuantKVCache(scheme, layer=5)
        one.update_and_fetch(keys[:, head : head + 1], values[:, head : head + 1])
        one.update_and_fetch(*(a[:, head : head + 1] for a in step))
        for a, b in zip(one.stored, whole.stored):
            assert mx.array_equal(a[:, :, :41], b[:, head : head + 1, :41])
        assert mx.array_equal(
            one.codec.key_mean, whole.codec.key_mean[:, head : head + 1]
        )
        assert mx.array_equal(one.sinks[0], whole.sinks[0][:, head : head + 1])


@pytest.mark.slow
def test_a_two_rank_tensor_server_batches_turbo4_requests(
    tiny_model, tiny_tokenizer_dir, tmp_path
):
    """mlx.launch -n 2 ... mlx_lm.server --kv-scheme turbo4 (a tensor group): concurrent
    requests are served in one batch, each answer is the one the same server gives the
    request alone, and rank 0 alone prints the notice."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    from pathlib import Path

    from helpers import BIN, Server, chat, free_port, text_of

    model_dir = shardable_model_dir(
        "llama", tiny_model, Path(tiny_tokenizer_dir), tmp_path
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_LM_TURBO")}
    env["MLX_LM_TURBO_LOG_BATCHES"] = "1"
    server = Server.__new__(Server)  # its client half; started under mlx.launch here
    server.port = free_port()
    server.process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlx.launch"),
            *("-n", "2", "--backend", "ring", "--hosts", "127.0.0.1"),
            *("--starting-port", str(free_port_pair()), "--"),
            *(str(BIN / "mlx_lm.server"), "--model", str(model_dir)),
            *("--port", str(server.port), "--kv-scheme", "turbo4"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # the launcher and both ranks, stopped together
    )
    requests = [
        chat(f"tell me about {w}" + " please" * i) for i, w in enumerate("abcd")
    ]
    batched, errors = {}, []

    def client(i):
        try:
            batched[i] = text_of(server.ask("/v1/chat/completions", requests[i]))
        except Exception as error:  # collected, asserted below
            errors.append(repr(error))

    try:
        deadline = time.time() + 90
        while True:  # ready once rank 0 accepts connections
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
                break
            except OSError:
                assert server.process.poll() is None, "the launcher exited"
                assert time.time() < deadline, "the server did not start"
                time.sleep(0.3)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        alone = [text_of(server.ask("/v1/chat/completions", r)) for r in requests]
    finally:
        os.killpg(server.process.pid, signal.SIGTERM)
        log = server.process.communicate(timeout=30)[1]
    assert not errors, errors[:2] + [log[-2000:]]
    assert [batched[i] for i in range(4)] == alone
    batch_sizes = [
        int(line.split("batching ")[1].split()[0])
        for line in log.splitlines()
        if "batching " in line
    ]
    assert batch_sizes and max(batch_sizes) >= 2, log[-2000:]
    assert log.count("[mlx-lm-turbo] llama: KV caches") == 1, log[-2000:]
