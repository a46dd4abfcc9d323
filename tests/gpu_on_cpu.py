"""This project's GPU kernels run on a CPU: ``mx.fast.cuda_kernel`` and
``mx.fast.metal_kernel`` stood in for by a g++ build of the source MLX would compile
(the same header, body and argument list) over ``cuda_on_cpu.h`` or ``metal_on_cpu.h``
and ``gpu_on_cpu.h``, which runs each thread of a block as a fiber.

It checks what a kernel computes, not how fast: the index arithmetic, the fragment
layouts of the tensor-core steps, the warps' merges, the last block's log-sum-exp,
the encoding of a raw token, what is written in place. Tensor-core sums run in
float32 in a fixed order, so results match the GPU's to rounding, not bit for bit. A
Metal build run here has met no Metal compiler (C++ takes what Metal's may refuse). A
launch runs when it is called, on its evaluated inputs (MLX's graph would run it later,
in the same order: each launch takes the one before as input)."""

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import numpy as np

HERE = Path(__file__).parent
SHIMS = {"cuda": HERE / "cuda_on_cpu.h", "metal": HERE / "metal_on_cpu.h"}
RUNTIME = HERE / "gpu_on_cpu.h"
COMPILER = shutil.which("g++")
COMMAND = (
    "-std=c++17",
    "-O1",
    "-march=native",  # fp16 conversions in hardware (a build is this machine's alone)
    "-w",
    "-shared",
    "-fPIC",
    "-fno-strict-aliasing",
    "-U_FORTIFY_SOURCE",  # its longjmp check refuses the jumps between fibers' stacks
)
C_TYPES = {  # by backend, as MLX names each dtype in a kernel's signature
    "cuda": {mx.float16: "__half", mx.bfloat16: "__nv_bfloat16"},
    "metal": {mx.float16: "float16_t", mx.bfloat16: "bfloat16_t"},
}
for types in C_TYPES.values():
    types.update(
        {
            mx.float32: "float",
            mx.bool_: "bool",
            mx.uint32: "uint32_t",
            mx.int32: "int32_t",
            mx.uint16: "uint16_t",
            mx.uint8: "uint8_t",
            mx.int64: "int64_t",
        }
    )
# The thread attributes MLX's Metal kernels take where their source names them, and
# their values here (the runtime's block, grid and fiber).
METAL_ATTRIBUTES = {
    "threadgroup_position_in_grid": ("uint3", "uint3{b.x, b.y, b.z}"),
    "threadgroups_per_grid": ("uint3", "uint3{g.x, g.y, g.z}"),
    "threads_per_threadgroup": ("uint3", "uint3{n.x, n.y, n.z}"),
    "thread_position_in_grid": (
        "uint3",
        "uint3{b.x * n.x + t.x, b.y * n.y + t.y, b.z * n.z + t.z}",
    ),
    "thread_index_in_threadgroup": ("uint", "t.x + n.x * (t.y + n.y * t.z)"),
    "thread_index_in_simdgroup": ("uint", "uint(f->lane)"),
    "simdgroup_index_in_threadgroup": ("uint", "uint(f->warp)"),
}
# The order blocks and lanes run in (gpu_on_cpu.h); another seed hunts for races.
SEED = int(os.environ.get("GPU_ON_CPU_SEED", "0"))
# The same bits as a dtype numpy knows (bfloat16 as uint16), for the buffer's address.
NUMPY_VIEW = {mx.bfloat16: mx.uint16}


_LIBRARIES = {}  # program -> its loaded build


def build_dir():
    """Where the builds are kept (by a digest of their source): across runs on one
    machine, so only changed kernels are compiled again."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    path = Path(root) / "mlx-lm-turbo" / "gpu_on_cpu"
    path.mkdir(parents=True, exist_ok=True)
    return path


class EmulatedKernel:
    """What ``mx.fast.cuda_kernel(...)`` or ``mx.fast.metal_kernel(...)`` returns
    (``backend``: "cuda" or "metal"), run on the CPU."""

    def __init__(
        self,
        backend,
        name,
        input_names,
        output_names,
        source,
        header="",
        ensure_row_contiguous=True,
        atomic_outputs=False,
        shared_memory=0,
    ):
        self.backend = backend
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.source = source
        self.header = header
        self.ensure_row_contiguous = ensure_row_contiguous
        self.shared_memory = shared_memory
        # what MLX passes besides an input's pointer: its shape, strides and ndim
        # where the source names them
        self.named = [
            tuple(f"{n}_{part}" in source for part in ("shape", "strides", "ndim"))
            for n in self.input_names
        ]

    def _program(self, inputs, output_dtypes, template):
        types = C_TYPES[self.backend]
        metal = self.backend == "metal"
        params, unpack = [], []

        def arg(c_type, name):
            params.append(f"{c_type} {name}")
            unpack.append(f"({c_type})a[{len(unpack)}]")

        space, const_space = ("device ", "constant ") if metal else ("", "")
        for name, array, (shape, strides, ndim) in zip(
            self.input_names, inputs, self.named
        ):
            arg(f"const {space}{types[array.dtype]}*", name)
            if array.ndim > 0:
                if shape:
                    arg(f"const {const_space}int32_t*", f"{name}_shape")
                if strides:
                    arg(f"const {const_space}int64_t*", f"{name}_strides")
                if ndim:
                    params.append(f"int {name}_ndim")
                    unpack.append(f"*(const int32_t*)a[{len(unpack)}]")
        for name, dtype in zip(self.output_names, output_dtypes):
            arg(f"{space}{types[dtype]}*", name)

        def value(v):
            if isinstance(v, bool):
                return "true" if v else "false"
            return str(v) if isinstance(v, int) else types[v]

        if metal:  # template parameters, and the thread attributes the source names
            for attribute, (c_type, at) in METAL_ATTRIBUTES.items():
                if attribute in self.source:
                    params.append(f"{c_type} {attribute}")
                    unpack.append(at)
            kinds = ", ".join(
                f"{'bool' if isinstance(v, bool) else 'int'} {n}"
                if isinstance(v, int)
                else f"typename {n}"
                for n, v in template
            )
            values = ", ".join(value(v) for _, v in template)
            kernel = (
                # threadgroup memory is static here (metal_on_cpu.h)
                "#undef TG_SHARED\n#define TG_SHARED static\n"
                f"template <{kinds}>\n"
                f"void {self.name}({', '.join(params)}) {{\n{self.source}\n}}\n"
            )
            call = f"{self.name}<{values}>"
        else:  # MLX-CUDA's template values are constants in the body
            constants = "".join(
                f"  using {n} = {types[v]};\n"
                if not isinstance(v, int)
                else f"  constexpr {'bool' if isinstance(v, bool) else 'int'} {n} = "
                f"{value(v)};\n"
                for n, v in template
            )
            kernel = (
                "namespace mlx::core::cu {\n"
                f"void {self.name}({', '.join(params)}) {{\n{constants}\n"
                f"{self.source}\n}}\n"
                "}  // namespace mlx::core::cu\n"
            )
            call = f"mlx::core::cu::{self.name}"
        # the block's dynamic shared memory (common.cuh's DYNAMIC_SHARED_ARRAY), static
        # here as its other shared arrays
        dynamic = (
            ""
            if metal
            else "#define DYNAMIC_SHARED_ARRAY(name) static __attribute__((aligned(128)))"
            f" uint32_t name[{self.shared_memory // 4 + 1}]\n"
        )
        return (
            f'#include "{SHIMS[self.backend]}"\n{dynamic}{self.header}\n{kernel}'
            "static void thread_body(void* args) {\n"
            "  void** a = static_cast<void**>(args);\n"
            "  const gpu_on_cpu::Fiber* f = gpu_on_cpu::current;\n"
            "  const dim3 b = gpu_on_cpu::block_idx, g = gpu_on_cpu::grid_dim;\n"
            "  const dim3 n = gpu_on_cpu::block_dim, t = f->index;\n"
            f"  {call}({', '.join(unpack)});\n"
            "}\n"
            'extern "C" void launch(void** args, const unsigned* grid, '
            "const unsigned* block, unsigned seed) {\n"
            "  gpu_on_cpu::launch(thread_body, args, {grid[0], grid[1], grid[2]}, "
            "{block[0], block[1], block[2]}, seed);\n"
            "}\n"
        )

    def _library(self, program):
        """The loaded build of ``program``: built once a machine, loaded once a run."""
        library = _LIBRARIES.get(program)
        if library is None:
            library = _LIBRARIES[program] = self._load(program)
        return library

    def _load(self, program):
        # the name's own digest (build.py's) covers the path of the sources it includes
        stem = re.sub(r"_[0-9a-f]{16}$", "", self.name)[:40]
        path = build_dir() / f"{stem}_{_digest(program.replace(self.name, stem))}.so"
        if not path.exists():
            src = path.with_suffix(".cpp")
            src.write_text(program)
            header = _precompiled_shim(self.backend)
            _compile(self.name, ["-include", str(header), str(src)], path)
        library = ctypes.CDLL(str(path))
        library.launch.restype = None
        return library

    def __call__(
        self,
        inputs,
        output_shapes,
        output_dtypes,
        grid,
        threadgroup,
        template=(),
        init_value=None,
        verbose=False,
        stream=None,
    ):
        inputs = list(inputs)
        if self.ensure_row_contiguous:
            inputs = [mx.contiguous(a) for a in inputs]
        mx.eval(inputs)
        program = self._program(inputs, output_dtypes, template)
        library = self._library(program)
        keep, pointers, write_back = [], [], []

        def buffer(array):
            # the array's own memory (writes land in it, as a kernel's do on a GPU);
            # where it is not aligned as a GPU's allocations are (256 bytes: a vector
            # load's alignment holds there), a copy that is, copied back after
            view = array
            if array.dtype in NUMPY_VIEW:
                view = mx.view(array, NUMPY_VIEW[array.dtype])
                mx.eval(view)
            data = np.array(view, copy=False)
            if data.size and data.ctypes.data % ALIGNMENT:
                aligned = _aligned_like(data)
                write_back.append((data, aligned))
                data = aligned
            keep.append(data)
            return data

        def small(values, dtype):
            data = np.ascontiguousarray(values, dtype)
            keep.append(data)
            pointers.append(data.ctypes.data)

        for array, (shape, strides, ndim) in zip(inputs, self.named):
            data = buffer(array)
            pointers.append(data.ctypes.data if data.size else 0)
            if array.ndim > 0:
                if shape:
                    small(array.shape, np.int32)
                if strides:
                    small([s // data.itemsize for s in data.strides], np.int64)
                if ndim:
                    small([array.ndim], np.int32)
        outputs = []
        for shape, dtype in zip(output_shapes, output_dtypes):
            # unwritten memory reads as all ones (NaN), as uninitialised memory may
            raw = np.full(int(np.prod(shape)) * dtype.size, 0xFF, np.uint8)
            if init_value is not None:
                raw.view(_numpy_dtype(dtype))[:] = init_value
            keep.append(raw)
            pointers.append(raw.ctypes.data)
            outputs.append((raw, shape, dtype))
        args = (ctypes.c_void_p * len(pointers))(*pointers)
        blocks = [-(-g // t) for g, t in zip(grid, threadgroup)]  # grid counts threads
        library.launch(
            args,
            (ctypes.c_uint * 3)(*blocks),
            (ctypes.c_uint * 3)(*threadgroup),
            ctypes.c_uint(SEED),
        )
        for data, aligned in write_back:
            data[...] = aligned
        return [_to_mlx(raw, shape, dtype) for raw, shape, dtype in outputs]


ALIGNMENT = 256


def _aligned_like(data):
    """A copy of a contiguous array at an address aligned to ALIGNMENT."""
    raw = np.empty(data.nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    aligned = raw[start : start + data.nbytes].view(data.dtype).reshape(data.shape)
    aligned[...] = data
    return aligned


def _numpy_dtype(dtype):
    return np.dtype(str(NUMPY_VIEW.get(dtype, dtype)).rsplit(".", 1)[-1])


def _to_mlx(raw, shape, dtype):
    array = mx.array(raw.view(_numpy_dtype(dtype))).reshape(shape)
    return mx.view(array, dtype) if dtype in NUMPY_VIEW else array


@lru_cache(maxsize=None)
def _precompiled_shim(backend):
    """A header that includes ``backend``'s shim, precompiled (g++ takes it first, with
    -include): the shim, the runtime and the standard headers they include were half
    of each build's time. Its digest covers the shim's path, which the programs
    #include again (#pragma once skips it there only where the path is the same)."""
    shim = SHIMS[backend]
    digest = hashlib.sha256(
        "\0".join([*COMMAND, platform.node(), str(shim), ""]).encode()
        + shim.read_bytes()
        + RUNTIME.read_bytes()
    ).hexdigest()[:24]
    header = build_dir() / f"{backend}_on_cpu_{digest}.h"
    precompiled = Path(f"{header}.gch")
    if not precompiled.exists():
        partial = header.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(f'#include "{shim}"\n')
        partial.replace(header)
        _compile(shim.name, ["-x", "c++-header", str(header)], precompiled)
    return header


def _compile(name, arguments, path):
    """g++ with ``arguments``, its output written to ``path`` (whole or not at all)."""
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    command = [COMPILER, *COMMAND, *arguments, "-o", str(partial)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"g++ could not build {name} for the CPU:\n{done.stderr[-4000:]}"
        )
    partial.replace(path)


def _digest(program):
    """A digest of what g++ reads to build ``program``: the text of each file it
    #includes by absolute path (the shim, the kernels' sources) in place of the path, so
    an edited kernel is built again and a clone at another path finds the same builds."""
    digest = hashlib.sha256("\0".join([*COMMAND, platform.node(), ""]).encode())
    for line in program.splitlines(keepends=True):
        if line.startswith('#include "/'):
            digest.update(Path(line.split('"')[1]).read_bytes())
        else:
            digest.update(line.encode())
    digest.update(RUNTIME.read_bytes())
    return digest.hexdigest()[:24]


def cuda_kernel(name, input_names, output_names, source, header="", **options):
    """Stands in for ``mx.fast.cuda_kernel``."""
    return EmulatedKernel(
        "cuda", name, input_names, output_names, source, header, **options
    )


def metal_kernel(name, input_names, output_names, source, header="", **options):
    """Stands in for ``mx.fast.metal_kernel``."""
    return EmulatedKernel(
        "metal", name, input_names, output_names, source, header, **options
    )
