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
from mlx_lm import load
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache
from test_cli import BIN

import mlx_lm_turbo.codec.rotation as rotation
from mlx_lm_turbo import make_prompt_cache
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


def with_meta_changed(source, target, change):
    """Copy a saved cache file with each layer's metadata (its state's first leaf, a string
    stored as character codes) changed by ``change(meta)``."""
    arrays, metadata = mx.load(str(source), return_metadata=True)
    for layer in range(len([k for k in metadata if k.startswith("1.")])):
        meta = json.loads("".join(map(chr, arrays[f"{layer}.0"].tolist())))
        change(meta)
        arrays[f"{layer}.0"] = mx.array([ord(c) for c in json.dumps(meta)])
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


def test_format_1_files_continue_unless_they_hold_sliding_window_layers(
    tmp_path, monkeypatch
):
    # Format 2 changed only the sliding-window caches' rule (sink tokens, statistics
    # measured on them): format-1 full-attention layers continue exactly; format-1
    # sliding-window layers, whose statistics came from their first chunk, are refused.
    import mlx_lm_turbo.cache.cache as cache_module
    from mlx_lm_turbo import TurboQuantKVCache, TurboQuantRotatingKVCache

    cache_module.register_cache_classes()
    k1, k2 = mx.random.split(mx.random.key(0))
    keys = mx.random.normal((1, 2, 41, 64), key=k1).astype(mx.float16)
    values = mx.random.normal((1, 2, 41, 64), key=k2).astype(mx.float16)
    for cache in (TurboQuantKVCache("turbo4"), TurboQuantRotatingKVCache("turbo4", 16)):
        cache.update_and_fetch(keys[:, :, :40], values[:, :, :40])
        path = str(tmp_path / f"{type(cache).__name__}.safetensors")
        with monkeypatch.context() as m:  # saved as format 1 (its layout is format 2's)
            m.setattr(cache_module, "FORMAT_VERSION", 1)
            save_prompt_cache(path, [cache])
        if isinstance(cache, TurboQuantRotatingKVCache):
            with pytest.raises(
                CacheFormatError, match="sliding-window layers were saved"
            ):
                load_prompt_cache(path)
            continue
        (loaded,) = load_prompt_cache(path)
        assert json.loads(loaded.meta_state[0])["format"] == FORMAT_VERSION
        a, _ = cache.update_and_fetch(keys[:, :, 40:], values[:, :, 40:])
        b, _ = loaded.update_and_fetch(keys[:, :, 40:], values[:, :, 40:])
        for x, y in zip((*a.stored, *a.sinks), (*b.stored, *b.sinks)):
            assert mx.array_equal(x, y).item()
