"""Saved prompt caches stay readable, or are refused saying why: a file saved by release
0.1.0 (tests/fixtures/turbo-0.1.0, README there) is refused, since today's rules would
continue it differently."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import BIN
from mlx_lm import load
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

import mlx_lm_turbo.codec.rotation as rotation
from mlx_lm_turbo import make_prompt_cache
from mlx_lm_turbo.attach.files import PREVIOUS_CHECKSUM_KEY, previous_checksum, read
from mlx_lm_turbo.cache.cache import FORMAT_VERSION
from mlx_lm_turbo.errors import CacheFormatError, UsageError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "turbo-0.1.0"


@pytest.fixture(scope="module")
def fixture_model():
    return load(str(FIXTURE))


def generate(tmp_path, *args):
    """mlx_lm.generate where the fixture was saved: its files name the model "model"."""
    model = tmp_path / "model"
    if not model.exists():
        shutil.copytree(FIXTURE, model)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_LM_TURBO")}
    return subprocess.run(
        [str(BIN / "mlx_lm.generate"), "--model", "model", *map(str, args)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )


ZERO_ONE_ZERO = "saved by mlx-lm-turbo 0.1.0, which compressed under other rules"


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("name", ["plain", "rotating"])
def test_a_file_saved_by_0_1_0_is_refused_with_the_reason(name, tmp_path):
    """0.1.0's files cannot continue as 0.1.0 did under today's rules (16 sink tokens,
    statistics from them, each query reading only itself exactly): refused, never a
    silently different continuation."""
    with pytest.raises(CacheFormatError, match=ZERO_ONE_ZERO):
        load_prompt_cache(str(FIXTURE / f"{name}.safetensors"))
    result = generate(
        tmp_path,
        "--prompt-cache-file",
        f"model/{name}.safetensors",
        "--prompt",
        " and more",
        "--max-tokens",
        12,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert ZERO_ONE_ZERO in result.stderr and "Re-create it" in result.stderr
    assert "Traceback" not in result.stderr


def with_meta_changed(source, target, change, checksummed=False):
    """Copy a saved cache file with each layer's metadata (its state's first leaf, a string
    stored as character codes) changed by ``change(meta)`` (and, ``checksummed``, the
    previous version's checksum made again, as that version would have saved it)."""
    arrays, metadata = mx.load(str(source), return_metadata=True)
    for layer in range(len([k for k in metadata if k.startswith("1.")])):
        meta = json.loads("".join(map(chr, arrays[f"{layer}.0"].tolist())))
        change(meta)
        arrays[f"{layer}.0"] = mx.array([ord(c) for c in json.dumps(meta)])
    mx.save_safetensors(str(target), arrays, metadata)
    if checksummed:
        _, classes, states = read(target)
        metadata[f"0.{PREVIOUS_CHECKSUM_KEY}"] = previous_checksum(classes, states)
        mx.save_safetensors(str(target), arrays, metadata)
    return target


@pytest.mark.parametrize(
    "change, why",
    [
        (
            lambda meta: meta.update(format=FORMAT_VERSION + 1),
            f"saved in format {FORMAT_VERSION + 1} by a newer mlx-lm-turbo; this one reads formats up to "
            f"{FORMAT_VERSION}. Upgrade mlx-lm-turbo or re-create the cache.",
        ),
        # The file check before loading names the missing entry first.
        (lambda meta: meta.pop("sink_tokens"), "its metadata has sink_tokens=None"),
    ],
    ids=["newer", "incomplete"],
)
@pytest.mark.slow  # a subprocess
def test_newer_and_incomplete_files_are_refused_by_the_commands_with_the_reason(
    change, why, tmp_path
):
    path = with_meta_changed(
        FIXTURE / "plain.safetensors", tmp_path / "edited.safetensors", change
    )
    with pytest.raises(UsageError, match=why.split(";")[0]):
        load_prompt_cache(str(path))
    result = generate(
        tmp_path, "--prompt-cache-file", path, "--prompt", "x", "--max-tokens", 2
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert why in result.stderr and "Traceback" not in result.stderr


def test_new_files_name_their_format_and_rotation(fixture_model, tmp_path):
    model, _ = fixture_model
    cache = make_prompt_cache(model, "turbo3")
    tokens = mx.array([[5, 6, 7, 8, 9, 10, 11]])
    model(tokens[:, :-1], cache=cache)
    save_prompt_cache(str(tmp_path / "c.safetensors"), cache)
    loaded = load_prompt_cache(str(tmp_path / "c.safetensors"))
    for c in loaded:
        meta = json.loads(c.meta_state[0])
        assert (
            meta["format"] == FORMAT_VERSION
            and json.loads(meta["codec"])["signs"] == rotation.SIGNS
        )
    last = tokens[:, -1:]
    assert mx.array_equal(model(last, cache=loaded), model(last, cache=cache)).item()


SAVED_FORMAT_2 = FIXTURE.parent / "format-2"


@pytest.mark.parametrize("version", [1, 2])
def test_format_1_and_2_files_continue_exactly(tmp_path, version):
    # Format 3 joined each layer's four arrays into rows; format 2 changed only the
    # sliding-window rule, so a format-1 full-attention file is format 2's. A file saved
    # by the format-2 code (fixture) must continue exactly as a cache fed every token.
    import mlx_lm_turbo.cache.cache as cache_module
    from mlx_lm_turbo import TurboQuantKVCache

    cache_module.register_cache_classes()
    path = with_meta_changed(
        SAVED_FORMAT_2 / "cache.safetensors",
        tmp_path / "saved.safetensors",
        lambda meta: meta.update(format=version),
        checksummed=True,
    )
    inputs = mx.load(str(SAVED_FORMAT_2 / "inputs.safetensors"))
    keys, values = inputs["keys"], inputs["values"]
    loaded = load_prompt_cache(str(path))
    for layer, (scheme, cache) in enumerate(zip(("turbo4", "turbo0v4"), loaded)):
        assert json.loads(cache.meta_state[0])["format"] == FORMAT_VERSION
        assert cache.recent_exact == 1 and cache.recent is None  # its own window
        fresh = TurboQuantKVCache(scheme, seed=1, layer=layer)
        fresh.update_and_fetch(keys[:, :, :40], values[:, :, :40])
        a, _ = fresh.update_and_fetch(keys[:, :, 40:], values[:, :, 40:])
        b, _ = cache.update_and_fetch(keys[:, :, 40:], values[:, :, 40:])
        for x, y in zip((*a.stored, *a.sinks), (*b.stored, *b.sinks)):
            assert x.shape == y.shape and mx.array_equal(x, y).item()


def test_format_1_sliding_window_files_are_refused(tmp_path, monkeypatch):
    # Format-1 sliding-window layers measured their statistics on their first chunk.
    import mlx_lm_turbo.cache.cache as cache_module
    from mlx_lm_turbo import TurboQuantRotatingKVCache

    cache_module.register_cache_classes()
    k1, k2 = mx.random.split(mx.random.key(0))
    keys = mx.random.normal((1, 2, 40, 64), key=k1).astype(mx.float16)
    values = mx.random.normal((1, 2, 40, 64), key=k2).astype(mx.float16)
    cache = TurboQuantRotatingKVCache("turbo4", 16)
    cache.update_and_fetch(keys, values)
    path = str(tmp_path / "rotating.safetensors")
    with monkeypatch.context() as m:
        m.setattr(cache_module, "FORMAT_VERSION", 1)
        save_prompt_cache(path, [cache])
    with pytest.raises(CacheFormatError, match="sliding-window layers were saved"):
        load_prompt_cache(path)


def test_format_3_files_continue_exactly_with_their_own_window(tmp_path):
    # Format 4 added the recent tokens' copies after the sink arrays: a format-3 file
    # (written here in format 3's layout) continues as a cache that reads only each
    # query itself exactly besides the sink tokens, as it was saved.
    import mlx_lm_turbo.cache.cache as cache_module
    from mlx_lm_turbo import TurboQuantKVCache, TurboQuantRotatingKVCache

    cache_module.register_cache_classes()
    inputs = mx.load(str(SAVED_FORMAT_2 / "inputs.safetensors"))
    keys, values = inputs["keys"], inputs["values"]
    made = [TurboQuantKVCache("turbo4"), TurboQuantRotatingKVCache("turbo4", 64)]
    for c in made:
        c.update_and_fetch(keys[:, :, :40], values[:, :, :40])

    def format_3(cache):
        meta = json.loads(cache.meta_state[0])
        meta["format"] = 3
        del meta["recent_exact"]
        state = cache.state
        # a stand-in named like the class: mlx-lm saves what its state returns
        saved = type(type(cache).__name__, (), {})()
        # without format 4's recent copies and format 5's query energies
        saved.state = [json.dumps(meta), *state[1:5], *state[8:]]
        saved.meta_state = ("",)
        return saved

    path = str(tmp_path / "format-3.safetensors")
    save_prompt_cache(path, [format_3(c) for c in made])
    loaded = load_prompt_cache(path)
    for cache, fresh in zip(loaded, made):
        assert cache.recent_exact == 1 and cache.is_trimmable()
        a, _ = fresh.update_and_fetch(keys[:, :, 40:], values[:, :, 40:])
        b, _ = cache.update_and_fetch(keys[:, :, 40:], values[:, :, 40:])
        assert a.window == b.window == 1
        for x, y in zip(
            (*a.stored, a.new_keys, *(a.sinks or ())),
            (*b.stored, b.new_keys, *(b.sinks or ())),
        ):
            assert x.shape == y.shape and mx.array_equal(x, y).item()
