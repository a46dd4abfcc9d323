"""Bad input gets a clear error at the right moment (issue 12): usage errors exit 2 with a
message, never a traceback, a server that cannot serve, or silent garbage.

Commands run in-process (their ``main`` with ``sys.argv`` patched) where a subprocess
would behave the same; the server and the start-up hook need subprocesses.
"""

import re
import sys

import pytest
import tiny_models
from helpers import LLAMA_HD16, free_port, run, run_main
from mlx_lm.utils import _get_classes

import mlx_lm_turbo.settings as settings
from mlx_lm_turbo import make_prompt_cache, parse_scheme
from mlx_lm_turbo.errors import UsageError

GEMMA2 = dict(
    model_type="gemma2",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    vocab_size=tiny_models.VOCAB,
    num_key_value_heads=1,
)


def model_from_config(config):
    model_class, args_class = _get_classes(config)
    return model_class(
        args_class.from_dict({"vocab_size": tiny_models.VOCAB, **config})
    )


@pytest.fixture
def overrides(tmp_path, monkeypatch):
    """overrides(text) -> path of an overrides file in force for this test."""
    from mlx_lm_turbo.plugin.registry import registry

    path = tmp_path / "overrides.toml"
    monkeypatch.setenv("MLX_LM_TURBO_OVERRIDES", str(path))
    registry.cache_clear()

    def write(text):
        """Write the file (None: leave it missing) and have the plugin read it afresh."""
        if text is not None:
            path.write_text(text)
        registry.cache_clear()
        return path

    yield write
    registry.cache_clear()


# -- the server checks everything it can before serving ------------------------


@pytest.mark.parametrize(
    "toml, message",
    [
        (
            '[[override]]\nmodel_type = "llama"\nopt_out = true\n',
            "turned off for model type 'llama'",
        ),
        (
            '[[override]]\nmodel_type = "llama"\nscheme = "turbo9"\n',
            "Did you mean turbo8?",
        ),
    ],
)
@pytest.mark.slow  # a subprocess
def test_server_refuses_before_serving(tiny_model, tmp_path, toml, message):
    path = tmp_path / "overrides.toml"
    path.write_text(toml)
    result = run(
        "mlx_lm.server",
        "--model",
        tiny_model("llama"),
        "--port",
        free_port(),
        "--kv-scheme",
        "turbo4",
        env={"MLX_LM_TURBO_OVERRIDES": str(path)},
        timeout=60,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr and "Starting httpd" not in result.stderr


@pytest.mark.parametrize(
    "config, message",
    [
        (GEMMA2, "cannot serve model type 'gemma2'"),
        (LLAMA_HD16, "no codebook for head_dim=16"),
    ],
)
def test_start_up_check_traces_what_a_request_would_meet(config, message):
    from mlx_lm_turbo.attach.preflight import check_model

    active = settings.Settings(parse_scheme("turbo4"))
    with pytest.raises(UsageError, match=message):
        check_model(model_from_config(config), active)
    check_model(
        model_from_config(dict(LLAMA_HD16, head_dim=32, hidden_size=128)), active
    )  # fine


def test_start_up_check_covers_the_kernel_choice(monkeypatch):
    from mlx_lm_turbo.attach.preflight import check_model

    monkeypatch.setenv(
        "MLX_LM_TURBO_KERNEL", "on"
    )  # head dim 80: no kernel, on any backend
    with pytest.raises(
        UsageError,
        match="MLX_LM_TURBO_KERNEL=on, but the fused kernels cannot run for cache entry 0",
    ):
        check_model(
            model_from_config(tiny_models.CONFIGS["llama_hd80"]),
            settings.Settings(parse_scheme("turbo4")),
        )


@pytest.mark.parametrize(
    "value, message",
    [
        ("bogus", "MLX_LM_TURBO_KERNEL='bogus' is not one of auto, on, off."),
        ("on", "MLX_LM_TURBO_KERNEL=on, but the fused kernels cannot run"),
    ],
)
def test_kernel_choice_errors_are_usage_errors(
    value, message, tiny_model, monkeypatch, capsys
):
    monkeypatch.setenv("MLX_LM_TURBO_KERNEL", value)
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--model",
        tiny_model("llama_hd80"),
        "--prompt",
        "hi",
        "--max-tokens",
        1,
        "--kv-scheme",
        "turbo4",
    )
    err = capsys.readouterr().err
    assert status == 2 and message in err


def test_server_check_names_a_model_it_cannot_load(tmp_path):
    from types import SimpleNamespace

    from mlx_lm_turbo.attach.preflight import check_server

    args = SimpleNamespace(
        model=str(tmp_path / "missing"), draft_model=None, trust_remote_code=False
    )
    with pytest.raises(UsageError, match="Model .*missing.* not found"):
        check_server(args, settings.Settings(parse_scheme("turbo4")))


def test_one_check_refuses_a_head_dim_without_codebook_everywhere(
    tiny_model, monkeypatch, capsys
):
    # generate, doctor and the Python API refuse it before printing or building anything
    monkeypatch.setitem(tiny_models.CONFIGS, "llama_hd16", LLAMA_HD16)
    path = str(tiny_model("llama_hd16"))
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--model",
        path,
        "--prompt",
        "hi",
        "--max-tokens",
        2,
        "--kv-scheme",
        "turbo4",
    )
    err = capsys.readouterr().err
    assert status == 2 and "no codebook for head_dim=16" in err
    assert "KV caches" not in err
    assert exit_status(["doctor", "--model", path, "--kv-scheme", "turbo3"]) == 1
    assert "refused: TurboQuant has no codebook for head_dim=16" in (
        capsys.readouterr().out
    )
    with pytest.raises(UsageError, match="no codebook for head_dim=16"):
        make_prompt_cache(model_from_config(LLAMA_HD16), "turbo4")


# -- prompt-cache files ------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_caches(tiny_model, tmp_path_factory):
    """Name -> path of a saved prompt cache: the tiny llama's turbo4, turbo0v4 and uncompressed
    caches, one still in its uncompressed start, and gpt_oss's, whose sliding layers are rings."""
    from mlx_lm import load, stream_generate
    from mlx_lm.models.cache import save_prompt_cache

    root = tmp_path_factory.mktemp("prompt-caches")
    files = {}
    for name, arch, scheme, options in [
        ("turbo4", "llama", "turbo4", {}),
        ("turbo0v4", "llama", "turbo0v4", {}),
        ("none", "llama", "none", {}),
        ("start", "llama", "turbo4", {"uncompressed_start": 500}),
        ("rings", "gpt_oss", "turbo4", {}),
        ("recent", "llama", "turbo4", {"recent_exact": 8}),
    ]:
        model_dir = str(tiny_model(arch))
        model, tokenizer = load(model_dir)
        cache = make_prompt_cache(model, scheme, boundary_skip=1, **options)
        for _ in stream_generate(
            model,
            tokenizer,
            tokenizer.encode("hello there " * 12),
            max_tokens=1,
            prompt_cache=cache,
        ):
            pass
        files[name] = root / f"{name}.safetensors"
        save_prompt_cache(
            str(files[name]), cache, {"model": model_dir, "tokenizer_config": "{}"}
        )
    return files


def damaged(source, target, edit, metadata_edit=None):
    """A copy of a prompt-cache file with ``edit(arrays, meta_of, set_meta)`` applied to its raw
    contents and ``metadata_edit`` to its file metadata (None deletes a key)."""
    import json

    import mlx.core as mx

    arrays, metadata = mx.load(str(source), return_metadata=True)
    metadata.update(metadata_edit or {})
    metadata = {k: v for k, v in metadata.items() if v is not None}

    def meta_of(entry):
        return json.loads("".join(map(chr, arrays[f"{entry}.0"].tolist())))

    def set_meta(entry, meta):
        text = meta if isinstance(meta, str) else json.dumps(meta)
        arrays[f"{entry}.0"] = mx.array([ord(c) for c in text], dtype=mx.int32)

    if edit is not None:
        edit(arrays, meta_of, set_meta)
    mx.save_safetensors(str(target), arrays, metadata)
    return target


def _set(entry, **fields):
    def edit(arrays, meta_of, set_meta):
        meta = meta_of(entry)
        for name, value in fields.items():
            if name.startswith("codec_"):
                codec = json.loads(meta["codec"])
                codec[name[6:]] = value
                meta["codec"] = json.dumps(codec)
            else:
                meta[name] = value
        set_meta(entry, meta)

    import json

    return edit


def _every_entry(**fields):
    def edit(arrays, meta_of, set_meta):
        for entry in range(len({k.split(".")[0] for k in arrays})):
            _set(entry, **fields)(arrays, meta_of, set_meta)

    return edit


def _swap_entries(arrays, meta_of, set_meta):
    one = {k[2:]: arrays.pop(k) for k in list(arrays) if k.startswith("1.")}
    two = {k[2:]: arrays.pop(k) for k in list(arrays) if k.startswith("2.")}
    arrays.update({f"1.{k}": a for k, a in two.items()})
    arrays.update({f"2.{k}": a for k, a in one.items()})


def _random_codes(arrays, meta_of, set_meta):
    import mlx.core as mx

    rows = arrays["2.8"]  # codes changed, the norms word (last) kept
    codes = mx.random.randint(0, 2**31, rows.shape, key=mx.random.key(3))
    arrays["2.8"] = mx.concatenate(
        [codes[..., :-1].astype(mx.uint32), rows[..., -1:]], axis=-1
    )


def _nan_norms(arrays, meta_of, set_meta):
    import mlx.core as mx

    rows = arrays["2.8"]  # the norms word: two fp16 NaNs
    nan = mx.full((*rows.shape[:3], 1), 0x7E007E00, dtype=mx.uint32)
    arrays["2.8"] = mx.concatenate([rows[..., :-1], nan], axis=-1)


DAMAGE = {  # case: (saved file, edit, what the message says)
    "offset larger": (
        "turbo4",
        _set(1, offset=500),
        r"cache 1 \(TurboQuantKVCache\): its offset is 500 but it stores",
    ),
    "offset smaller": ("turbo4", _set(1, offset=3), "its offset is 3 but it stores"),
    "codec key dim": (
        "turbo4",
        _set(2, codec_key_dim=64),
        r"rows array has shape \(1, 2, \d+, 33\), expected \(1, 2, \d+, 25\)",
    ),
    "scheme vs codec": (
        "turbo4",
        _set(2, scheme="turbo3"),
        "codec's scheme turbo4 disagrees with its scheme turbo3",
    ),
    "scheme vs arrays": (
        "turbo4",
        _set(2, scheme="turbo3", codec_scheme="turbo3"),
        r"expected \(1, 2, \d+, 25\)",
    ),
    "missing rows": (
        "turbo4",
        lambda arrays, *_: arrays.pop("1.8"),
        r"it stores 0 token arrays, but turbo4 stores 1 \(rows\)",
    ),
    "query energies cut": (
        "turbo4",
        lambda arrays, *_: arrays.update({"2.7": arrays["2.7"][..., :-1]}),
        r"cache 2 \(TurboQuantKVCache\): the query-energy array has shape",
    ),
    "metadata not JSON": (
        "turbo4",
        lambda arrays, meta_of, set_meta: set_meta(0, "{not json"),
        "its metadata is not JSON",
    ),
    "NaN norms": (
        "turbo4",
        _nan_norms,
        r"cache 2 \(TurboQuantKVCache\): the norms in the rows array holds NaN",
    ),
    "bad dtype": (
        "turbo4",
        _set(3, codec_dtype="int8"),
        "codec's dtype 'int8' is not one of",
    ),
    "random codes": (
        "turbo4",
        _random_codes,
        "do not match the checksum saved with them",
    ),
    "ring index": (
        "rings",
        _set(0, idx=10**6),
        r"ring metadata \(max_size 16, keep 0, idx 1000000\) does not fit",
    ),
    "ring offset": ("rings", _set(0, offset=5), "its offset is 5 but it stores"),
    "recent tokens": (
        "recent",
        _set(2, recent_exact=3),
        r"cache 2 \(TurboQuantKVCache\): it keeps 7 recent tokens, expected 2",
    ),
    "recent copies lost": (
        "recent",
        lambda arrays, *_: (arrays.pop("2.5"), arrays.pop("2.6")),
        "the recent-keys array is missing",
    ),
    "recent window": (
        "recent",
        _set(2, recent_exact=0),
        "its metadata has recent_exact=0",
    ),
    "unknown class": (
        "turbo4",
        None,
        "holds caches of class MysteryCache, which neither mlx-lm nor mlx-lm-turbo",
    ),
    "entries swapped": (
        "turbo4",
        _swap_entries,
        r"cache 1 \(TurboQuantKVCache\) has layer 2, its contents table lists layer 1",
    ),
    "seed in every entry": (
        "turbo4",
        _every_entry(seed=7, codec_seed=7),
        r"cache 0 \(TurboQuantKVCache\) has seed 7, its contents table lists seed 0",
    ),
    "ring window": (
        "rings",
        _set(0, max_size=8),
        "has max_size 8, its contents table lists max_size 16",
    ),
    "key scales of 0": (
        "turbo4",
        lambda arrays, *_: arrays.update({"2.2": arrays["2.2"] * 0}),
        "the key-scale array holds scales that are not positive",
    ),
    "rotation signs": (
        "turbo4",
        _set(2, codec_signs="bogus"),
        "its codec's rotation signs 'bogus' are not 'splitmix64'",
    ),
    "plain cache state": (
        "none",
        lambda arrays, *_: arrays.update({"0.3": arrays["0.0"]}),
        r"cache 0 \(KVCache\): its state does not make a KVCache \(ValueError\('too many",
    ),
    "model path": (
        "turbo4",
        None,
        "its metadata or caches do not match the checksum saved with them",
    ),
    "uncompressed start offset": (
        "start",
        _set(1, offset=5000),
        "its offset is 5000 but its uncompressed start",
    ),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damaged_prompt_cache_file_is_refused_naming_it(case, saved_caches, tmp_path):
    from mlx_lm_turbo.attach.files import check
    from mlx_lm_turbo.errors import PromptCacheFileError

    source, edit, message = DAMAGE[case]
    path = damaged(
        saved_caches[source],
        tmp_path / "damaged.safetensors",
        edit,
        metadata_edit={
            "unknown class": {"1.3": "MysteryCache"},
            "model path": {"0.model": "/elsewhere"},
        }.get(case),
    )
    with pytest.raises(PromptCacheFileError) as info:
        check(path)
    assert str(info.value).startswith(f"Prompt-cache file {path} ")
    assert re.search(message, str(info.value))


def test_good_prompt_cache_files_pass(saved_caches, tmp_path):
    from mlx_lm_turbo.attach.files import CHECKSUM_KEY, check
    from mlx_lm_turbo.errors import PromptCacheFileError

    for path in saved_caches.values():
        check(path, with_model=True)
    # the checksum is required
    path = damaged(
        saved_caches["turbo4"],
        tmp_path / "plain.safetensors",
        None,
        metadata_edit={f"0.{CHECKSUM_KEY}": None},
    )
    with pytest.raises(PromptCacheFileError, match=f"{path} holds .* no checksum"):
        check(path)


def with_checksum(path):
    """``path`` rewritten with the checksum of what it holds now (anyone can)."""
    import mlx.core as mx

    from mlx_lm_turbo.attach.files import CHECKSUM_KEY, checksum, read

    arrays, metadata = mx.load(str(path), return_metadata=True)
    metadata[f"0.{CHECKSUM_KEY}"] = checksum(*read(path))
    mx.save_safetensors(str(path), arrays, metadata)
    return path


def test_a_file_is_checked_against_its_model_before_use(
    saved_caches, tiny_model, tmp_path
):
    from mlx_lm import load
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    from mlx_lm_turbo.errors import PromptCacheFileError

    other = str(tiny_model("llama_hd80"))
    path = with_checksum(
        damaged(
            saved_caches["turbo4"],
            tmp_path / "other.safetensors",
            None,
            metadata_edit={"0.model": other},
        )
    )
    with pytest.raises(PromptCacheFileError) as info:
        load_prompt_cache(str(path))
    assert str(info.value).startswith(
        f"Prompt-cache file {path} does not fit model {other}: cache 0 holds 2 KV "
        "heads of dims 128/128, the model's layer 1 of 80/80."
    )
    # an entry short, saved so: its own table agrees, the model does not
    llama = str(tiny_model("llama"))
    cache = load_prompt_cache(str(saved_caches["turbo4"]))
    short = str(tmp_path / "short.safetensors")
    save_prompt_cache(short, cache[:-1], {"model": llama, "tokenizer_config": "{}"})
    with pytest.raises(PromptCacheFileError, match="holds 5 caches, the model makes 6"):
        load_prompt_cache(short)
    load(llama)  # the model itself is fine


def test_unreadable_prompt_cache_files_are_refused(saved_caches, tmp_path):
    import mlx.core as mx

    from mlx_lm_turbo.attach.files import check
    from mlx_lm_turbo.errors import PromptCacheFileError

    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(saved_caches["turbo4"].read_bytes()[:5000])
    text = tmp_path / "text.safetensors"
    text.write_text("hello")
    weights = tmp_path / "weights.safetensors"
    mx.save_safetensors(str(weights), {"w": mx.zeros((2,))}, {"format": "mlx"})
    for path, message in [
        (truncated, "not a complete safetensors file"),
        (text, "not a complete safetensors file"),
        (weights, "was not written by mlx-lm's save_prompt_cache"),
        (tmp_path / "missing.safetensors", "does not exist"),
    ]:
        with pytest.raises(
            PromptCacheFileError, match=f"{path}.*{message}|{message}.*{path}"
        ):
            check(path)


def test_generate_with_a_damaged_file_exits_2_naming_it(
    saved_caches, tmp_path, monkeypatch, capsys
):
    path = damaged(saved_caches["turbo4"], tmp_path / "nan.safetensors", _nan_norms)
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--prompt-cache-file",
        path,
        "--prompt",
        "and",
        "--max-tokens",
        2,
    )
    err = capsys.readouterr().err
    assert status == 2 and f"mlx-lm-turbo: Prompt-cache file {path} is damaged" in err


@pytest.mark.parametrize("scheme", [[], ["--kv-scheme", "turbo4"]])
def test_speculative_decoding_from_an_untrimmable_file_exits_2_saying_why(
    saved_caches, tiny_model, monkeypatch, capsys, scheme
):
    # A file made with --turbo-recent-exact 8 cannot be trimmed: mlx-lm's speculative
    # decoding would stop on it with a traceback.
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--prompt-cache-file",
        saved_caches["recent"],
        "--draft-model",
        tiny_model("llama"),
        "--prompt",
        "and",
        "--max-tokens",
        2,
        *scheme,
    )
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert "was made with --turbo-recent-exact 8: its caches keep exact copies" in err


def test_draft_model_decodes_speculatively_with_trimmable_caches_by_default(
    tiny_model, monkeypatch, capsys
):
    # Speculative decoding trims its caches, which the default window forbids: with
    # --draft-model and nothing typed each query reads only itself exactly.
    model = tiny_model("llama")
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        *("--model", model, "--draft-model", model, "--kv-scheme", "turbo4"),
        *("--prompt", "hello there", "--max-tokens", 6),
    )
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    # no window, and the boundary layers that pay without one
    assert "KV caches 4 x turbo8, 2 x turbo4" in err
    assert "tokens before it exactly" not in err
    assert "Generation:" in out


@pytest.mark.parametrize(
    "saved, flag, holds",
    [
        ("turbo4", "turbo3", "holds KV caches 2 x turbo8, 4 x turbo4"),
        ("none", "turbo4", "holds KV caches 6 x KVCache"),
        ("turbo4", "turbo4", None),
    ],
)
def test_kv_scheme_with_a_saved_cache_says_what_the_file_holds(
    saved, flag, holds, saved_caches, monkeypatch, capsys
):
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--prompt-cache-file",
        saved_caches[saved],
        "--prompt",
        "and",
        "--max-tokens",
        2,
        "--kv-scheme",
        flag,
    )
    err = capsys.readouterr().err
    assert status == 0, err
    if holds:
        assert (
            f"{saved_caches[saved]} {holds}" in err
            and f"--kv-scheme {flag} does not change it" in err
        )
    else:
        assert "does not change it" not in err


@pytest.mark.parametrize(
    "saved, typed, noted", [("recent", 4, True), ("recent", 8, False)]
)
def test_a_typed_window_with_a_saved_cache_says_the_file_keeps_its_own(
    saved, typed, noted, saved_caches, monkeypatch, capsys
):
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        *("--prompt-cache-file", saved_caches[saved], "--prompt", "and"),
        *("--max-tokens", 2, "--kv-scheme", "turbo4", "--turbo-recent-exact", typed),
    )
    err = capsys.readouterr().err
    assert status == 0, err
    note = (
        f"{saved_caches[saved]} was made with --turbo-recent-exact 8: a loaded prompt "
        f"cache keeps its window, so --turbo-recent-exact {typed} does not change it."
    )
    assert (note in err) == noted, err


# -- scheme names and settings ------------------------------------------------------


@pytest.mark.parametrize(
    "env, args, message",
    [
        (
            {"MLX_LM_TURBO_KV_SCHEME": "turbo5"},
            [],
            "$MLX_LM_TURBO_KV_SCHEME: Unknown KV scheme 'turbo5'",
        ),
        (
            {"MLX_LM_TURBO_KV_SCHEME": "turbo4"},
            ["--kv-bits", 4],
            "$MLX_LM_TURBO_KV_SCHEME=turbo4 and --kv-bits both compress the KV cache; use one of them (unset",
        ),
        ({}, ["--kv-scheme", "turbo5"], "--kv-scheme: Unknown KV scheme 'turbo5'"),
        (
            {},
            ["--kv-scheme", "turbo4", "--turbo-uncompressed-start", -1],
            "--turbo-uncompressed-start must be >= 0",
        ),
        (
            {},
            ["--kv-scheme", "turbo4", "--turbo-recent-exact", 0],
            "--turbo-recent-exact must be >= 1",
        ),
        (
            {},
            ["--kv-scheme", "turbo4", "--turbo-recent-exact", 8, "--draft-model", "x"],
            "--turbo-recent-exact 8 keeps exact copies of the last tokens only, so its "
            "caches cannot be trimmed, and speculative decoding (--draft-model) trims them",
        ),
        (
            {},
            ["--kv-scheme", "turbo4", "--turbo-boundary-skip", 99999999999999999999],
            "boundary skip of 99999999999999999999 (--turbo-boundary-skip) is more than the 6 attention layers",
        ),
    ],
)
def test_settings_errors_name_what_the_user_set(
    env, args, message, tiny_model, monkeypatch, capsys
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--max-tokens",
        1,
        *args,
    )
    err = capsys.readouterr().err
    assert status == 2 and message in err and "Traceback" not in err
    if env:
        assert "--kv-scheme:" not in err


@pytest.mark.parametrize(
    "args, note",
    [
        (
            ["--turbo-boundary-skip", 3],
            "--turbo-boundary-skip 3 has no effect without --kv-scheme",
        ),
        (
            ["--turbo-recent-exact", 8],
            "--turbo-recent-exact 8 has no effect without --kv-scheme",
        ),
        (
            ["--kv-scheme", "turbo4", "--turbo-boundary-skip", 3],
            "KV caches 6 x turbo8; no layer uses turbo4: every attention layer is a boundary layer",
        ),
    ],
)
def test_settings_that_change_nothing_are_said(
    args, note, tiny_model, monkeypatch, capsys
):
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--max-tokens",
        1,
        *map(str, args),
    )
    assert status == 0 and note in capsys.readouterr().err


def test_a_model_with_a_freed_models_id_is_announced(tiny_model, monkeypatch, capsys):
    # Said once per model object. A model loaded after another was freed may get its
    # id (a CI run lost the note so); one id for every model forces that here.
    from mlx_lm import load
    from mlx_lm.models import cache

    import mlx_lm_turbo.attach as attach

    monkeypatch.setattr(settings, "active", settings.Settings(parse_scheme("turbo4")))
    monkeypatch.setattr(attach, "id", lambda model: 1, raising=False)
    path = str(tiny_model("llama"))
    for _ in range(2):
        model, _ = load(path)
        cache.make_prompt_cache(model)
        assert "KV caches" in capsys.readouterr().err


@pytest.mark.parametrize(
    "value, off",
    [
        ("1", True),
        ("yes", True),
        ("false ", False),
        ("FALSE", False),
        ("no", False),
        ("off", False),
        ("0", False),
        ("", False),
    ],
)
def test_disable_values(value, off, monkeypatch):
    import mlx_lm_turbo_autoload

    monkeypatch.setenv("MLX_LM_TURBO_DISABLE", value)
    assert mlx_lm_turbo_autoload.disabled() is off


@pytest.mark.slow  # a subprocess
def test_disabled_plugin_says_why_its_options_and_files_fail(saved_caches, tiny_model):
    disabled = {"MLX_LM_TURBO_DISABLE": "1"}
    result = run(
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--kv-scheme",
        "turbo4",
        env=disabled,
        timeout=60,
    )
    assert (
        result.returncode == 2
        and "unrecognized arguments: --kv-scheme turbo4" in result.stderr
    )
    assert "because MLX_LM_TURBO_DISABLE is set" in result.stderr
    result = run(
        "mlx_lm.generate",
        "--prompt-cache-file",
        saved_caches["turbo4"],
        "--prompt",
        "hi",
        env=disabled,
        timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "holds TurboQuantKVCache caches, which load only with mlx-lm-turbo on"
        in result.stderr
    )


@pytest.mark.slow  # a subprocess
def test_disable_false_leaves_the_plugin_on():
    result = run(
        "mlx_lm.generate", "--help", env={"MLX_LM_TURBO_DISABLE": "false"}, timeout=60
    )
    assert result.returncode == 0 and "--kv-scheme" in result.stdout


# -- the overrides file ---------------------------------------------------------------

LLAMA = '[[override]]\nmodel_type = "llama"\n'


@pytest.mark.parametrize(
    "toml, message",
    [
        (
            LLAMA + 'opt_out = "no"\n',
            "Bad entry 0 in {path}: opt_out = 'no': it must be true or false.",
        ),
        (
            LLAMA + "boundary_skip = -3\n",
            "boundary_skip = -3: it must be an integer >= 0",
        ),
        (
            LLAMA + 'boundary_skip = "four"\n',
            "boundary_skip = 'four': it must be an integer >= 0",
        ),
        (
            LLAMA + 'schem = "turbo4"\n',
            "unknown key 'schem' (did you mean 'scheme'?); the keys are model_type, path,",
        ),
        (
            LLAMA + 'layer_schemes = { x = "turbo8" }\n',
            "layer_schemes key 'x': it must be a cache-entry number",
        ),
        (
            LLAMA + 'layer_schemes = { 1 = "turbo9" }\n',
            "layer_schemes 1 = 'turbo9': Unknown KV scheme",
        ),
        (LLAMA + 'scheme = "none"\n', "use opt_out = true"),
        (
            '[[override]]\nscheme = "turbo4"\n',
            "give exactly one of model_type and path",
        ),
        (
            '[overrides]\nmodel_type = "llama"\n',
            "has key 'overrides': write each override as an [[override]] table",
        ),
        ('[override]\nmodel_type = "llama"\n', "has a single [override] table"),
        ("[[override]\n", "Cannot read mlx-lm-turbo overrides file {path}"),
        (
            None,
            "Cannot read mlx-lm-turbo overrides file {path}: [Errno 2] No such file",
        ),
    ],
)
def test_bad_overrides_file_entries_are_named(toml, message, overrides):
    from mlx_lm_turbo.errors import OverridesFileError
    from mlx_lm_turbo.plugin.registry import registry

    path = overrides(toml)
    with pytest.raises(OverridesFileError) as info:
        registry()
    assert message.format(path=path) in str(info.value)


@pytest.mark.parametrize(
    "toml, message",
    [
        (
            LLAMA + 'layer_schemes = { 99 = "turbo8" }\n',
            "layer_schemes entry 99 of an override ({path} [override 0]) is beyond model type 'llama', "
            "whose caches are entries 0-5",
        ),
        (
            LLAMA + "boundary_skip = 7\n",
            "boundary skip of 7 (an override) is more than the 6 attention layers",
        ),
    ],
)
def test_overrides_that_do_not_fit_the_model_are_refused(
    toml, message, overrides, tiny_model
):
    from mlx_lm import load

    from mlx_lm_turbo import plan

    path = overrides(toml)
    model, _ = load(str(tiny_model("llama")), lazy=True)
    with pytest.raises(UsageError) as info:
        plan(model, "turbo4")
    assert message.format(path=path) in str(info.value)


def test_override_on_a_state_layer_is_refused(overrides, tiny_model):
    from mlx_lm import load

    from mlx_lm_turbo import plan

    overrides(
        '[[override]]\nmodel_type = "qwen3_5"\nlayer_schemes = { 0 = "turbo8" }\n'
    )
    model, _ = load(str(tiny_model("qwen3_5")), lazy=True)
    with pytest.raises(
        UsageError, match="names a recurrent-state entry of model type 'qwen3_5'"
    ):
        plan(model, "turbo4")


def test_doctor_reports_bad_settings_without_a_traceback(
    overrides, monkeypatch, capsys
):
    from mlx_lm_turbo.tools import doctor

    path = overrides(LLAMA + 'opt_out = "no"\n')
    monkeypatch.setenv("MLX_LM_TURBO_KV_SCHEME", "turbo7")
    monkeypatch.setenv("MLX_LM_TURBO_KERNEL", "bogus")
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert (
        "MLX_LM_TURBO_KERNEL: INVALID: MLX_LM_TURBO_KERNEL='bogus' is not one of auto, on, off."
        in out
    )
    assert (
        f"user overrides file: {path} (INVALID: Bad entry 0 in {path}: opt_out = 'no'"
        in out
    )
    assert (
        "MLX_LM_TURBO_KV_SCHEME: INVALID: Unknown KV scheme 'turbo7'. Did you mean turbo6v2?"
        in out
    )


# -- our own commands -----------------------------------------------------------------


def exit_status(argv):
    from mlx_lm_turbo.tools.cli import main

    try:
        return main(argv) or 0
    except SystemExit as exit:
        return exit.code


def test_help_lists_the_commands(capsys):
    assert exit_status(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("demo", "bench", "doctor"):
        assert f"\n  {command} " in out
    assert exit_status(["foo"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'foo'" in err and "\n  doctor " in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kv-scheme", "garbage"], "--kv-scheme: Unknown KV scheme 'garbage'"),
        (["--kv-scheme", "none"], "not 'none'"),
        (["--turbo-boundary-skip", "-1"], "--turbo-boundary-skip must be >= 0"),
        (["--model", "/nonexistent"], "Model '/nonexistent' not found"),
    ],
)
def test_doctor_bad_input_is_a_usage_error(args, message, capsys):
    assert exit_status(["doctor", *args]) == 2
    assert message in capsys.readouterr().err


def test_doctor_refusal_is_reported_not_raised(overrides, tiny_model, capsys):
    overrides(LLAMA + "opt_out = true\n")
    assert exit_status(["doctor", "--model", str(tiny_model("llama"))]) == 1
    assert (
        "refused: TurboQuant is turned off for model type 'llama'"
        in capsys.readouterr().out
    )


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("args", [["doctor"], ["--help"]])
def test_output_into_a_closed_pipe_stops_quietly(args):
    import subprocess

    from helpers import BIN

    process = subprocess.Popen(
        [str(BIN / "mlx-lm-turbo"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdout.close()  # like `| head -0`: every write finds no reader
    _, err = process.communicate(timeout=60)
    assert (
        process.returncode == 141
        and "Traceback" not in err
        and "BrokenPipeError" not in err
    )


def test_an_unverified_metal_kernel_that_fails_its_check_is_refused(
    tiny_model, monkeypatch, capsys
):
    # On an Apple GPU, =on first checks the Metal decode kernel against the portable
    # path (cache/kernel_check.py); a kernel that fails to build there is a usage error.
    from mlx_lm_turbo.cache import kernel_check
    from mlx_lm_turbo.kernels import dispatch

    monkeypatch.setattr(dispatch, "gpu_backend", lambda: "metal")
    monkeypatch.setattr(
        kernel_check,
        "check_decode_kernel",
        lambda backend: "it failed to build or run (turbo4): program_source:12: error",
    )
    monkeypatch.setenv("MLX_LM_TURBO_KERNEL", "on")
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--max-tokens",
        1,
        "--kv-scheme",
        "turbo4",
    )
    err = capsys.readouterr().err
    assert status == 2
    assert "not been verified on Apple GPUs, and on this machine it failed" in err
    assert "Traceback" not in err


# -- Python API arguments -------------------------------------------------------------


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"boundary_skip": "2"}, TypeError, "boundary_skip must be an integer >= 0"),
        ({"boundary_skip": 2.5}, TypeError, "boundary_skip must be an integer >= 0"),
        ({"boundary_skip": True}, TypeError, "boundary_skip must be an integer >= 0"),
        (
            {"uncompressed_start": "5"},
            TypeError,
            "uncompressed_start must be an integer >= 0, got '5'",
        ),
        ({"uncompressed_start": 1.5}, TypeError, "uncompressed_start must be"),
        ({"seed": "x"}, TypeError, "seed must be an integer >= 0, got 'x'"),
        ({"recent_exact": 0}, ValueError, "recent_exact must be an integer >= 1"),
        ({"key_calibration": "bogus"}, ValueError, "Unknown key calibration 'bogus'"),
        (
            {"layer_schemes": {-1: "turbo8"}},
            ValueError,
            r"each layer_schemes key \(a cache entry\) must be an integer >= 0, got -1",
        ),
        (
            {"layer_schemes": {"0": "turbo8"}},
            TypeError,
            "each layer_schemes key .* got '0'",
        ),
        ({"layer_schemes": ["turbo8"]}, TypeError, "layer_schemes must be a dict"),
        (
            {"layer_schemes": {99: "turbo8"}},
            UsageError,
            r"The layer_schemes entry 99 is beyond model type 'llama', whose caches are "
            r"entries 0-5\.",
        ),
    ],
)
def test_api_arguments_are_checked_at_the_call(options, error, message):
    model = model_from_config(tiny_models.CONFIGS["llama"])
    with pytest.raises(error, match=message):
        make_prompt_cache(model, "turbo4", **options)


def test_api_model_and_updates_are_checked_at_the_call():
    import mlx.core as mx

    from mlx_lm_turbo import TurboQuantKVCache

    with pytest.raises(TypeError, match="model must be a loaded mlx-lm model"):
        make_prompt_cache(None, "turbo4")
    empty = mx.zeros((1, 2, 0, 64))
    with pytest.raises(ValueError, match="at least one token; got"):
        TurboQuantKVCache("turbo4").update_and_fetch(empty, empty)


# -- smaller ones -----------------------------------------------------------------------


def test_an_empty_kv_scheme_is_a_usage_error(tiny_model, monkeypatch, capsys):
    monkeypatch.setenv("MLX_LM_TURBO_KV_SCHEME", "turbo4")
    status = run_main(
        monkeypatch,
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--kv-scheme",
        "",
    )
    assert status == 2
    assert "--kv-scheme: give a scheme" in capsys.readouterr().err


def test_an_overrides_file_may_start_with_a_bom(overrides):
    from mlx_lm_turbo.plugin.registry import registry

    overrides("\ufeff" + LLAMA + 'scheme = "turbo8"\n')
    assert registry().resolve("llama")["scheme"] == "turbo8"


@pytest.mark.parametrize("glob", ["[*", ""])
def test_a_path_glob_that_matches_nothing_is_refused(glob, overrides):
    from mlx_lm_turbo import register_override
    from mlx_lm_turbo.errors import OverridesFileError
    from mlx_lm_turbo.plugin.registry import registry

    path = overrides(f'[[override]]\npath = "{glob}"\nscheme = "turbo8"\n')
    with pytest.raises(OverridesFileError, match=f"Bad entry 0 in {path}: .*no model"):
        registry()
    overrides("")
    with pytest.raises(ValueError, match="would match no model"):
        register_override(path=glob, scheme="turbo8")


def test_bench_input_and_output_errors_are_usage_errors(tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert exit_status(["bench", "--from-json", str(empty)]) == 2
    assert "holds no rows" in capsys.readouterr().err
    taken = tmp_path / "taken"
    taken.write_text("")
    assert exit_status(["bench", "--out", str(taken), "--from-json", str(empty)]) == 2
    assert f"--out {taken} is a file" in capsys.readouterr().err


def test_ctrl_c_in_our_commands_exits_130_quietly(monkeypatch, capsys):
    from mlx_lm_turbo.tools import demo

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "main", interrupted)
    assert exit_status(["demo"]) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_python_m_says_the_console_script_takes_kv_scheme(monkeypatch, capsys):
    from mlx_lm_turbo.attach import hint_for_python_m

    argv = ["python", "-m", "mlx_lm.generate", "--kv-scheme", "turbo4"]
    monkeypatch.setattr(sys, "orig_argv", argv)
    hint_for_python_m()
    assert "run mlx_lm.generate (or python -m mlx_lm generate)" in (
        capsys.readouterr().err
    )
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "mlx_lm.generate"])
    hint_for_python_m()
    assert not capsys.readouterr().err
