"""Helpers the test modules share (fixtures stay in conftest.py)."""

import atexit
import copy
import itertools
import json
import locale
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlx.core as mx
import pytest
import tiny_models
from mlx_lm import load
from mlx_lm.generate import generate_step
from tokenizers.pre_tokenizers import ByteLevel

from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention
from mlx_lm_turbo.kernels import KERNEL_ENV

ON_CUDA = mx.default_device() == mx.gpu and mx.cuda.is_available()
# On CPU a row's result does not depend on the batch shape around it; GPU backends
# choose kernels and reduction orders by shape.
BIT_EXACT = mx.default_device().type == mx.cpu
SCRIPTS = Path(__file__).parents[1] / "scripts"
BIN = Path(sys.executable).parent

# -- arrays ----------------------------------------------------------------------


def relative_error(a, b):
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return (mx.linalg.norm(a - b) / mx.linalg.norm(b)).item()


def outlier_keys(shape, seed=0, outlier_channels=4, bias=8.0):
    """Keys like real models': a per-channel bias and a few channels of large magnitude."""
    B, H, T, D = shape
    k1, k2, k3 = mx.random.split(mx.random.key(seed), 3)
    keys = mx.random.normal(shape, key=k1)
    channel_bias = bias * mx.random.normal((1, H, 1, D), key=k2) / D**0.5
    spread = mx.ones((D,))
    idx = mx.random.randint(0, D, (outlier_channels,), key=k3)
    spread[idx] = 10.0
    return keys * spread + channel_bias


def count_merges(monkeypatch, batch_class):
    """Record the number of caches each ``batch_class.merge`` joins (mlx-lm batches through it)."""
    merged = []
    original = batch_class.merge.__func__
    monkeypatch.setattr(
        batch_class,
        "merge",
        classmethod(
            lambda cls, caches: merged.append(len(caches)) or original(cls, caches)
        ),
    )
    return merged


def scripts_compile_kernels():
    """``scripts/compile_kernels.py`` as a module (the scripts are no package)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import compile_kernels
    finally:
        sys.path.remove(str(SCRIPTS))
    return compile_kernels


def forget_kernels():
    """Drop the kernels built so far and the layers' launch plans, so the next call
    builds them again (from what a test has patched: mx.fast, the launch constants)."""
    from mlx_lm_turbo.kernels import (
        decode_attention,
        decode_attention_simd,
        encode,
        prefill_attention,
    )

    decode_attention.forget_kernels()
    prefill_attention._kernel.cache_clear()
    prefill_attention._dequantizer.cache_clear()
    decode_attention_simd.kernels.cache_clear()
    encode._kernel.cache_clear()


# -- commands --------------------------------------------------------------------


def run(command, *args, env=None, stdin=None, timeout=240):
    """``command`` (a console script of this environment) run with ``args``, as
    ``subprocess.run`` runs it (its output captured as text). An mlx-lm command whose
    ``env`` sets nothing but MLX_LM_TURBO_DISABLE or MLX_LM_TURBO_KV_SCHEME runs as a
    child forked by a process of that environment that has imported mlx_lm already
    (``_Forker``): the state each of these scripts reaches on its first line, for a
    fraction of the start-up (mlx_lm's import takes over two seconds)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_LM_TURBO")}
    full_env.update(env or {})
    argv = [str(BIN / command), *map(str, args)]
    for check in START_CHECKS:
        check(argv[0])
    if command.split(".")[0] == "mlx_lm" and set(env or {}) <= FORKED_ENV:
        forker = _forker(full_env)
        if forker is not None:
            return forker.run(argv, full_env, stdin, timeout)
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=full_env,
        input=stdin,
        timeout=timeout,
    )


START_CHECKS = []  # each called with the program run() starts (tests/conftest.py)
# What an environment may set for its mlx-lm commands to be forked: settings read
# where they are used, not files that a test may rewrite between runs.
FORKED_ENV = {
    "MLX_LM_TURBO_DISABLE",
    "MLX_LM_TURBO_KV_SCHEME",
    "MLX_LM_TURBO_LOG_BATCHES",
}
# The forking process: sys.path as a script of BIN has it, then what each mlx-lm
# console script does first (``from mlx_lm.X import main`` imports mlx_lm, and with it
# the plugin's start-up hook attaches); then, for each job, a child that takes the
# job's working directory, stdin, stdout and stderr and runs the script as Python runs
# a script (its exit, or its uncaught exception's traceback and status 1). It says
# "start PID" for each job, "exit PID STATUS" as each child ends.
FORKER = """
import json, os, runpy, select, signal, sys, time
bin_dir, jobs_fd, results_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.argv = [""]
sys.path[0] = bin_dir
import mlx_lm
sys.stdout.flush()
sys.stderr.flush()
os.write(results_fd, b"ready\\n")
children, pending, open_jobs = set(), b"", True
while open_jobs or children:
    wait = 0.05 if children else None
    readable = open_jobs and select.select([jobs_fd], [], [], wait)[0]
    if not open_jobs:
        time.sleep(wait)
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            os.write(results_fd, b"exit %d %d\\n" % (pid, code))
    if not readable:
        continue
    data = os.read(jobs_fd, 65536)
    if not data:  # the tests are done: end what is still running
        open_jobs = False
        for pid in children:
            os.kill(pid, signal.SIGKILL)
    pending += data
    while b"\\n" in pending:
        line, pending = pending.split(b"\\n", 1)
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.close(jobs_fd)
            os.close(results_fd)
            os.chdir(job["cwd"])
            modes = (os.O_RDONLY, os.O_WRONLY | os.O_TRUNC, os.O_WRONLY | os.O_TRUNC)
            for fd, (path, mode) in enumerate(zip(job["files"], modes)):
                opened = os.open(path, mode)
                os.dup2(opened, fd)
                os.close(opened)
            import mlx.core
            mlx.core.random.seed(time.time_ns() % 2**64)  # as a new process seeds it
            os.environ.pop("PYTEST_CURRENT_TEST", None)
            os.environ.update(job["env"])
            sys.argv = job["argv"]
            runpy.run_path(sys.argv[0], run_name="__main__")
            sys.exit(0)
        children.add(pid)
        os.write(results_fd, b"start %d\\n" % pid)
"""
# Set per test by pytest: a child takes the job's value (a forker serves many tests).
PER_TEST_ENV = {"PYTEST_CURRENT_TEST"}
_FORKERS = {}  # environment -> its _Forker, or None where it cannot fork as a script


def _captured(path):
    """A file's text as subprocess.run(text=True) decodes output: the locale's
    encoding, universal newlines."""
    text = path.read_bytes().decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


class _Forker:
    """A process of one environment that has imported mlx_lm, forking a child per
    command (``FORKER``)."""

    def __init__(self, env):
        jobs_read, jobs_write = os.pipe()
        results_read, results_write = os.pipe()
        self.start_output = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                FORKER,
                str(BIN),
                str(jobs_read),
                str(results_write),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.start_output,
            stderr=self.start_output,
            pass_fds=(jobs_read, results_write),
        )
        os.close(jobs_read)
        os.close(results_write)
        self.jobs = os.fdopen(jobs_write, "w")
        self.results = results_read
        self.pending = b""
        self.exits = {}  # pid -> exit status, as each child ends

    def ready(self):
        """Whether it started as each script would, saying nothing (anything said at
        import would be each command's own output)."""
        try:
            ready = self._line(time.time() + 120)[0] == "ready"
        except (RuntimeError, subprocess.TimeoutExpired):
            ready = False
        self.start_output.seek(0)
        return ready and not self.start_output.read()

    def _line(self, deadline):
        """The next line (a child's exit goes to ``exits`` too)."""
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0, deadline - time.time())
            if not select.select([self.results], [], [], left)[0]:
                raise subprocess.TimeoutExpired("forker", 0)
            data = os.read(self.results, 4096)
            if not data:
                raise RuntimeError("the forking process exited")
            self.pending += data
        line, self.pending = self.pending.split(b"\n", 1)
        word, *values = line.decode().split()
        if word == "exit":
            self.exits[int(values[0])] = int(values[1])
        return word, values

    def start(self, argv, env, files):
        """The pid of a child running ``argv`` (stdin, stdout, stderr: ``files``)."""
        job = {
            "argv": argv,
            "cwd": os.getcwd(),
            "files": list(map(str, files)),
            "env": {k: v for k, v in env.items() if k in PER_TEST_ENV},
        }
        self.jobs.write(json.dumps(job) + "\n")
        self.jobs.flush()
        deadline = time.time() + 60
        while True:
            word, values = self._line(deadline)
            if word == "start":
                return int(values[0])

    def wait(self, pid, timeout):
        """The child's exit status (None if it runs on past ``timeout`` seconds; with
        ``timeout`` None, it waits for the child's end)."""
        deadline = None if timeout is None else time.time() + timeout
        try:
            while pid not in self.exits:
                self._line(deadline)
        except subprocess.TimeoutExpired:
            return None
        return self.exits.pop(pid)

    def run(self, argv, env, stdin, timeout):
        with tempfile.TemporaryDirectory() as tmp:
            files = [Path(tmp) / name for name in ("stdin", "stdout", "stderr")]
            for path in files:
                path.write_text("")
            if stdin is not None:
                files[0].write_text(stdin)
            else:
                files[0] = Path(os.devnull)
            pid = self.start(argv, env, files)
            returncode = self.wait(pid, timeout)
            if returncode is None:
                os.kill(pid, signal.SIGKILL)  # as subprocess.run kills its child
                self.wait(pid, 60)
                raise subprocess.TimeoutExpired(argv, timeout)
            stdout, stderr = map(_captured, files[1:])
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    def close(self):
        self.jobs.close()
        os.close(self.results)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


class _ForkedProcess:
    """What Server uses of a Popen (stdout dropped, stderr kept) for a forked child."""

    def __init__(self, forker, argv, env):
        self.forker = forker
        self.tmp = tempfile.TemporaryDirectory()
        self.stderr_file = Path(self.tmp.name) / "stderr"
        self.stderr_file.write_text("")
        files = [os.devnull, os.devnull, self.stderr_file]
        self.pid = forker.start(argv, env, files)
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.forker.wait(self.pid, 0)
        return self.returncode

    def terminate(self):
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)

    def communicate(self, timeout=None):
        if self.returncode is None:
            self.returncode = self.forker.wait(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.pid, timeout)
        stderr = _captured(self.stderr_file)
        self.tmp.cleanup()
        return None, stderr


def _forker(env):
    key = tuple(sorted((k, v) for k, v in env.items() if k not in PER_TEST_ENV))
    if key not in _FORKERS:
        forker = _Forker(dict(key))
        if not forker.ready():
            forker.close()
            forker = None
        _FORKERS[key] = forker
    return _FORKERS[key]


@atexit.register
def _close_forkers():
    for forker in _FORKERS.values():
        if forker is not None:
            forker.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_status(argv):
    """``mlx-lm-turbo ARGV`` in this process: its exit status."""
    from mlx_lm_turbo.tools.cli import main

    try:
        return main(argv) or 0
    except SystemExit as exit:
        return exit.code


# -- sequences and chunked generation ---------------------------------------------
H, D, HQ = 2, 64, 4  # KV heads, head dim, query heads of the synthetic caches
LENGTHS = [50, 7, 41]  # one row shorter than the sink tokens
DECODE = 6
PROMPT = [(7 * i + 3) % 250 + 5 for i in range(70)]  # longer than the 16 sink tokens
STEPS = 8
# Every query reads the same exact and compressed keys whatever the chunking; what still
# differs is float32 rounding with the chunk's shape (the model's own projections),
# now and then enough to move a coordinate on a codebook boundary to the next code.
ROUNDING = 0.06
# Outputs of magnitude ~2 in float16 (an ulp of 2e-3) summed in other orders by other
# shapes.
FP16_ROUNDING = 4e-3


def sequences(lengths=LENGTHS, decode=DECODE):
    out = []
    for i, n in enumerate(lengths):
        k = outlier_keys((1, H, n + decode, D), seed=i).astype(mx.float16)
        v = mx.random.normal((1, H, n + decode, D), key=mx.random.key(i + 9)).astype(
            mx.float16
        )
        q = mx.random.normal((1, HQ, n + decode, D), key=mx.random.key(i + 50)).astype(
            mx.float16
        )
        out.append((k, v, q))
    return out


def right_padded(arrays, lengths):
    width = max(lengths)
    return mx.concatenate(
        [
            mx.pad(a[:, :, :n], [(0, 0), (0, 0), (0, width - n), (0, 0)])
            for a, n in zip(arrays, lengths)
        ]
    )


def window_kv(n, seed=0):
    k1, k2, k3 = mx.random.split(mx.random.key(seed), 3)
    bias = 3.0 * mx.random.normal((1, H, 1, D), key=k3)  # statistics that matter
    keys = (mx.random.normal((1, H, n, D), key=k1) + bias).astype(mx.float16)
    values = mx.random.normal((1, H, n, D), key=k2).astype(mx.float16)
    queries = mx.random.normal((1, HQ, n, D), key=k3).astype(mx.float16)
    return keys, values, queries


def chunked_outputs(cache, chunks, keys, values, queries):
    """Each chunk's attention output as the model would compute it (the turbo path for
    a TurboKV, mlx-lm's attention for the uncompressed start)."""
    outs, start = [], 0
    for n in chunks:
        k, v = keys[:, :, start : start + n], values[:, :, start : start + n]
        fetched, fetched_values = cache.update_and_fetch(k, v)
        q = queries[:, :, start : start + n]
        if isinstance(fetched, mx.array):
            mask = "causal" if n > 1 else None
            outs.append(
                mx.fast.scaled_dot_product_attention(
                    q, fetched, fetched_values, scale=D**-0.5, mask=mask
                )
            )
        else:
            mask = "causal" if n > 1 else None
            outs.append(turbo_scaled_dot_product_attention(q, fetched, D**-0.5, mask))
        start += n
    return mx.concatenate(outs, axis=2)


def generate_tokens(model, prompt, cache, step):
    """Greedy tokens and their log-probabilities after prefilling ``prompt`` in ``step``-token chunks."""
    out = list(
        zip(
            range(STEPS),
            generate_step(
                mx.array(prompt),
                model,
                prompt_cache=cache,
                prefill_step_size=step,
                max_tokens=STEPS,
            ),
        )
    )
    return [t for _, (t, _) in out], mx.stack([p for _, (_, p) in out])


def load_sliding(tiny_model, arch):
    model, tokenizer = load(str(tiny_model(arch)))
    model.set_dtype(mx.float32)
    return model, tokenizer


# -- the kernels against the portable path ---------------------------------------

TOLERANCE = 2e-3
BF16_TOLERANCE = 4e-3


def latin_cases(*axes):
    """Every combination of the axes' values (a tuple value gives several arguments),
    on a GPU; on the kernels' CPU build only those whose indices sum to a multiple of
    the last axis's length: every value of each axis still runs, and of three axes of
    three values every pair of values meets."""
    cases = []
    for at in itertools.product(*(range(len(axis)) for axis in axes)):
        values = [axis[i] for axis, i in zip(axes, at)]
        flat = [
            v
            for value in values
            for v in (value if isinstance(value, tuple) else (value,))
        ]
        on_cpu = sum(at) % len(axes[-1]) == 0
        cases.append(
            pytest.param(*flat, marks=() if on_cpu else pytest.mark.gpu_matrix)
        )
    return cases


def filled_cache(cache, T, H, D, dtype, seed=0, chunk=None):
    """``cache`` after T tokens of keys and values (in chunks of ``chunk``). Without a
    GPU the tokens are encoded by the portable path: the kernels' CPU build runs each
    GPU thread as a fiber, where encoding a thousand tokens of eight heads took most of
    a kernel test's time (test_kernels.py's test_encode_matches_the_codec checks the
    encode kernel against the portable encoding, to the same arrays; what a test then
    launches reads them alike whoever wrote them)."""
    keys = outlier_keys((1, H, T, D), seed=seed).astype(dtype)
    values = mx.random.normal((1, H, T, D), key=mx.random.key(seed + 1)).astype(dtype)
    step = chunk or T
    mode = os.environ.get(KERNEL_ENV)
    if mx.default_device() != mx.gpu:
        os.environ[KERNEL_ENV] = "off"
    try:
        for start in range(0, T, step):
            cache.update_and_fetch(
                keys[:, :, start : start + step], values[:, :, start : start + step]
            )
    finally:
        if mode is None:
            os.environ.pop(KERNEL_ENV, None)
        else:
            os.environ[KERNEL_ENV] = mode
    return cache


def step_inputs(cache, L, H, G, D, dtype, seed=7):
    k = outlier_keys((1, H, L, D), seed=seed).astype(dtype)
    v = mx.random.normal((1, H, L, D), key=mx.random.key(seed + 1)).astype(dtype)
    q = mx.random.normal((1, H * G, L, D), key=mx.random.key(seed + 2)).astype(dtype)
    mask = cache.make_mask(L, return_array=False, window_size=None)
    view, _ = cache.update_and_fetch(k, v)
    return q, view, mask


def float32_reference(monkeypatch, q, view, mask, sinks=None, scale=None):
    """The portable path in float32 on the same compressed caches."""
    scale = scale or q.shape[-1] ** -0.5
    up = lambda a: None if a is None else a.astype(mx.float32)  # noqa: E731
    ref = copy.copy(view)
    ref.codec = copy.copy(view.codec)
    ref.codec.dtype = mx.float32
    ref.new_keys, ref.new_values = up(view.new_keys), up(view.new_values)
    if view.sinks is not None:
        ref.sinks = (up(view.sinks[0]), up(view.sinks[1]), view.sinks[2])
    if not view.codec.scheme.key_bits:  # keys stored in the model's dtype
        ref.stored = (up(view.stored[0]), *view.stored[1:])
    monkeypatch.setenv(KERNEL_ENV, "off")
    return turbo_scaled_dot_product_attention(
        q.astype(mx.float32), ref, scale, mask, sinks
    )


def assert_as_portable(monkeypatch, out, portable, q, view, mask, sinks=None):
    """A kernel's output against the portable path's (bfloat16: against float32, see
    above)."""
    if q.dtype != mx.bfloat16:
        assert relative_error(out, portable) < TOLERANCE
        return
    exact = float32_reference(monkeypatch, q, view, mask, sinks)
    assert relative_error(out, exact) < BF16_TOLERANCE
    # no further from it than the portable path, but for the rounding of an output
    # element (where both compute alike, as on the CPU, one bf16 ulp apart moves the
    # error by about 1e-9)
    assert relative_error(out, exact) <= relative_error(portable, exact) * 1.001


WIDTHS = [
    "turbo4",
    "turbo3",
    "turbo2",
    "turbo8",
    "turbo4v2",
    "turbo3v2",
    "turbo0v4",
    "turbo0v2",
    "turbo8v4",
    "turbo5v3",
    "turbo6v2",
    "turbo5v2",
    "turbo4v3",  # 4-bit keys' lane pairs beside 3-bit values
    "turbo3v4",  # 3-bit keys' pair table beside 4-bit values' lane pairs
]


# -- servers and in-process commands ---------------------------------------------


class Server:
    def __init__(self, model, *args, command=(str(BIN / "mlx_lm.server"),)):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_LM_TURBO")}
        env["MLX_LM_TURBO_LOG_BATCHES"] = "1"
        argv = [*command, "--model", str(model), "--port", str(self.port), *args]
        forker = None
        if list(command) == [str(BIN / "mlx_lm.server")]:  # forked as run() forks
            for check in START_CHECKS:
                check(argv[0])
            forker = _forker(env)
        if forker is not None:
            self.process = _ForkedProcess(forker, argv, env)
        else:
            self.process = subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        deadline = time.time() + 60
        while True:  # ready once it accepts connections
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.time() > deadline or self.process.poll() is not None:
                    raise RuntimeError("the server did not start")
                time.sleep(0.2)

    def ask(self, path, payload, stream=False):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps({**payload, "stream": stream}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            body = response.read().decode()
        if not stream:
            return json.loads(body)
        chunks = [
            json.loads(line[6:])
            for line in body.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
        return chunks

    def refusal(self, payload):
        """(HTTP status, error message) of a request that must be refused."""
        with pytest.raises(urllib.error.HTTPError) as refused:
            self.ask("/v1/chat/completions", payload)
        return refused.value.code, json.loads(refused.value.read())["error"]

    def stop(self):
        self.process.terminate()
        return self.process.communicate(timeout=30)[1]


def chat(content, max_tokens=8):
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }


def text_of(reply):
    return reply["choices"][0]["message"]["content"]


LLAMA_HD16 = dict(
    tiny_models.CONFIGS["llama"], hidden_size=64, num_attention_heads=4, head_dim=16
)


def run_main(monkeypatch, module_name, *args):
    """A command's (plugin-wrapped) main in this process: (exit status, stderr)."""
    import importlib

    main = (
        importlib.import_module(module_name).main
        if module_name.startswith("mlx_lm_turbo")
        else sys.modules[module_name].main
    )
    monkeypatch.setattr(sys, "argv", [module_name, *map(str, args)])
    try:
        status = main()
    except SystemExit as exit:
        status = exit.code
    return status or 0


# -- a tiny GGUF file ------------------------------------------------------------


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
