"""Compile the CUDA kernels' sources offline with nvcc, as mx.fast.cuda_kernel wraps them.

No GPU needed: catches syntax and template errors before device time is spent.
The stand-in header declares what MLX's JIT header provides (Shape, Strides, fp16 types).

    python scripts/compile_kernels.py [--arch sm_90]
    python scripts/compile_kernels.py --simd [--every 7]  # decode_attention_simd's CUDA build
    python scripts/compile_kernels.py --variants 72 --loops  # instructions per MMA loop
    python scripts/compile_kernels.py --variants 72 --loops --sass DIR  # and the listing
    python scripts/compile_kernels.py --variants 72 --warps-per-sm 20 --stage-buffers 1
    python scripts/compile_kernels.py --variants 144 --loops --value-mma-max-dim 128
    python scripts/compile_kernels.py --variants 72 75 --code-hashes  # before/after a move
    python scripts/compile_kernels.py --prefill  # the prefill kernel (wgmma: sm_90a)

``--loops`` disassembles each unit (nvdisasm: on PATH, or from the
``nvidia-cuda-nvdisasm`` wheel, unpacked with ``--nvdisasm DIR/bin/nvdisasm``) and
counts the SASS instructions of every loop holding tensor-core instructions and of
the loops inside those, indented: the decode kernel's tile loop (32 tokens an
iteration), its key loop (16 tokens) and its value loop (16 tokens on the tensor cores,
else one token), with their shared loads and their spilled registers' local loads and
stores. ``--sass DIR`` keeps each unit's whole listing there (``unitN.sass``), for
reading a path through the code that is not a loop. ``--code-hashes`` prints a hash of
each unit's machine code (its cubin's ``.text`` sections; the file around them differs
between builds of the same source): a change that should not alter the kernels, such
as moving a constant into the header, keeps every hash.
"""

import argparse
import hashlib
import itertools
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from mlx_lm_turbo.kernels.decode_attention import C_TYPES

PRELUDE = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda/std/array>
#include <cstdint>
#include <cooperative_groups.h>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 10>;
using Strides = cuda::std::array<int64_t, 10>;
}
"""


def wrap(name, body, header, inputs, outputs, template):
    """The translation unit MLX builds: header, then a __global__ function taking each
    input (with _shape/_strides where the body names them) and output."""
    params = []
    for arg, dtype in inputs:
        params.append(f"const {C_TYPES[dtype]}* {arg}")
        for suffix, kind in (("_shape", "Shape"), ("_strides", "Strides")):
            if arg + suffix in body:
                params.append(f"const __grid_constant__ {kind} {arg}{suffix}")
    params += [f"{C_TYPES[dtype]}* {arg}" for arg, dtype in outputs]
    consts = "".join(
        f"  using {k} = {C_TYPES[v]};\n"
        if isinstance(v, str)
        else f"  constexpr {'bool' if isinstance(v, bool) else 'int'} {k} = {str(v).lower()};\n"
        for k, v in template
    )
    return (
        PRELUDE
        + header
        + "namespace mlx::core::cu {\nnamespace cg = cooperative_groups;\n"
        f"__global__ void {name}("
        + ", ".join(params)
        + ") {\n"
        + consts
        + body
        + "\n}\n}\n"
    )


def attention_variants():
    from mlx_lm_turbo.kernels.decode_attention import template
    from mlx_lm_turbo.kernels.decode_call import flags

    for dtype, D, (G, L), (KB, VB), mask in itertools.product(
        ("float16", "bfloat16", "float32"),
        (64, 128, 256),
        ((4, 1), (1, 1), (4, 8)),
        ((4, 4), (3, 3), (2, 2), (8, 8), (4, 2), (0, 4), (5, 3), (6, 2)),
        (0, 1, 2),
    ):
        R = min(G * L, 1024 // D)
        # a decode token's own encoding in the launch (one token, quantized keys)
        raw_tail = L == 1 and KB > 0 and mask != 2
        # a window of recent rows before the raw token (with and without the row in place)
        recent = raw_tail and mask == 0
        flag_bits = flags(
            mask,
            True,
            D == 128,
            True,
            G == 4,
            D == 64,
            raw_tail,
            raw_tail and D != 128,
            raw_tail and G == 4,  # the row written in place too
            recent,
        )
        window = 32 if recent else 0 if L == 1 else 1
        yield (
            dtype,
            (raw_tail, recent),
            template(dtype, "bool", D, G, L, R, KB, VB, 4, window, flag_bits),
        )


def prefill_variants():
    """(wgmma, dtype, head dim, input names, final) of the prefill kernel's variants:
    each head dim and dtype once, a first launch over history and tail and a later
    one passing its state on."""
    from mlx_lm_turbo.kernels.prefill_attention import INPUTS

    first = tuple(n for n in INPUTS if n not in ("state_o", "state_ml", "pads"))
    later = tuple(n for n in INPUTS if n not in ("kb", "vb"))
    for wgmma, (dtype, D, names, final) in itertools.product(
        (False, True),
        (
            ("float16", 128, first, True),
            ("bfloat16", 128, later, False),
            ("float16", 64, later, True),
            ("bfloat16", 256, first, True),
        ),
    ):
        if not (wgmma and D > 128):
            yield wgmma, dtype, D, names, final


def prefill_unit(wgmma, dtype, D, names, final):
    """The prefill kernel's translation unit for one ``prefill_variants`` item."""
    import mlx.core as mx

    from mlx_lm_turbo.kernels import prefill_attention
    from mlx_lm_turbo.kernels.build import included

    outputs, header = prefill_attention.kernel_text(
        prefill_attention.tiling(D, wgmma), getattr(mx, dtype), D, names, final
    )
    types = {"state_o": "float32", "state_ml": "float32", "scale": "float32"}
    types.update(params="int32", pads="int32", o_out="float32", ml_out="float32")
    return wrap(
        "turbo_prefill_attention",
        included("prefill_attention.cu"),
        header,
        [(n, types.get(n, dtype)) for n in names],
        [(n, types.get(n, dtype)) for n in outputs],
        (),
    )


def attention_unit(dtype, kind, template):
    """The fused decode kernel's translation unit for one ``attention_variants`` item."""
    from mlx_lm_turbo.kernels import decode_attention
    from mlx_lm_turbo.kernels.build import source

    _, outputs, no_outputs = decode_attention.KERNELS[kind]
    values = dict(template)
    names = decode_attention.call_inputs(values["KB"], values["FLAGS"])
    types = {
        "q": dtype,
        "keys": dtype,
        "rows": "uint32",
        "workspace": "uint32",
        "previous": dtype,
        "sink_keys": dtype,
        "sink_values": dtype,
        "sink_pos": "int32",
        "tail_keys": dtype,
        "tail_values": dtype,
        "mask": "bool",
        "recent": "uint32",
    }
    output_types = {"out": dtype, "new_rows": "uint32", "next_recent": "uint32"}
    return wrap(
        "attention",
        source("decode_attention.cu"),
        decode_attention.kernel_header(4, decode_attention.dynamic_shared(4, template))
        + decode_attention.constants_header(template)
        + no_outputs
        + decode_attention.absent_inputs(names, dtype, "bool")
        + source("common.cuh"),
        [(n, types.get(n, "float32")) for n in names],
        [(n, output_types.get(n, "float32")) for n in outputs],
        (),
    )


def simd_variants():
    """The shared SIMD bodies' CUDA variants: (dtype, mask dtype, partials template,
    merge template)."""
    from mlx_lm_turbo.kernels.decode_call import flags

    for dtype, D, (G, L), (KB, VB), mask in itertools.product(
        ("float16", "bfloat16", "float32"),
        (64, 128, 256),
        ((4, 1), (1, 1), (3, 8)),
        ((4, 4), (3, 3), (2, 2), (8, 8), (4, 2), (0, 4), (5, 3), (6, 2)),
        (0, 1, 2),
    ):
        R = min(G * L, 1024 // D)
        mask_bool = mask != 2 or D != 128  # an additive mask at D = 128
        mask_dtype = "bool" if mask_bool else dtype
        flag_bits = flags(mask, mask_bool, D == 64, L > 1, G == 4, False)
        common = [("D", D), ("G", G), ("L", L), ("R", R)]
        partials = [("T", dtype), ("MT", mask_dtype), *common, ("KB", KB), ("VB", VB)]
        partials += [("NW", 4), ("FLAGS", flag_bits), ("WINDOW", 32 if L > 1 else 0)]
        merge = [("T", dtype), *common, ("NW", 4), ("HAS_SINKS", int(D != 128))]
        yield dtype, mask_dtype, partials, merge


def simd_units(dtype, mask_dtype, partials, merge, backend="cuda"):
    """The two kernels MLX's ``backend`` builds for one variant of the SIMD kernels:
    CUDA's translation units (``wrap``), or Metal's as C++ (``metal_wrap``)."""
    from mlx_lm_turbo.kernels import decode_attention_simd as simd
    from mlx_lm_turbo.kernels.decode_call import ATTENTION_INPUTS

    build = wrap if backend == "cuda" else metal_wrap
    header = simd.kernel_header(backend)
    types = {"rows": "uint32", "sink_pos": "int32", "mask": mask_dtype}
    exact = ("q", "keys", "sink_keys", "sink_values", "tail_keys", "tail_values")
    types.update({name: dtype for name in exact})
    return [
        build(
            "simd_attention",
            simd.kernel_source(backend, simd.BODIES[0]),
            header,
            [(n, types.get(n, "float32")) for n in ATTENTION_INPUTS],
            [("parts", "float32"), ("stats", "float32")],
            partials,
        ),
        build(
            "simd_merge",
            simd.kernel_source(backend, simd.BODIES[1]),
            header,
            [(n, "float32") for n in simd.MERGE_INPUTS],
            [("out", dtype)],
            merge,
        ),
    ]


# MLX's Metal preamble as C++ (names and types only; every operation a stand-in): the
# Metal build of the shared SIMD bodies can then be compiled by a C++ compiler on any
# machine, which catches undeclared names, type errors and C++ beyond Metal's C++14 in
# it, though not what only Metal's compiler or an Apple GPU can tell.
METAL_AS_CPP = """
#include <cmath>
#include <cstdint>
#include <algorithm>
#define threadgroup
#define device
#define constant
using uint = unsigned int;
using ushort = unsigned short;
struct uint3 { uint x, y, z; };
enum class mem_flags { mem_none, mem_device, mem_threadgroup };
inline void threadgroup_barrier(mem_flags) {}
inline void simdgroup_barrier(mem_flags) {}
inline float simd_sum(float x) { return x; }
inline float simd_max(float x) { return x; }
struct half { half() = default; half(float) {} operator float() const { return 0; } };
struct bfloat16_t {
  bfloat16_t() = default; bfloat16_t(float) {} operator float() const { return 0; } };
typedef half float16_t;
template <typename T, typename U> T as_type(U) { return T(); }
namespace metal { inline float exp2(float x) { return std::exp2(x); } }
using namespace metal;
using std::fmax; using std::max; using std::min;
"""
METAL_TYPES = {
    "float16": "float16_t",
    "bfloat16": "bfloat16_t",
    "float32": "float",
    "bool": "bool",
    "uint32": "uint32_t",
    "int32": "int32_t",
}
# The thread attributes MLX adds to a Metal kernel's signature where its source names
# them, with their types (mlx/backend/metal: metal_kernel).
METAL_ATTRIBUTES = {
    "threadgroup_position_in_grid": "uint3",
    "threadgroups_per_grid": "uint3",
    "thread_index_in_threadgroup": "uint",
    "thread_index_in_simdgroup": "uint",
    "simdgroup_index_in_threadgroup": "uint",
    "thread_position_in_grid": "uint3",
    "threads_per_threadgroup": "uint3",
}


def metal_wrap(name, body, header, inputs, outputs, template):
    """The Metal kernel MLX writes (a templated function of the inputs, with _shape and
    _strides where the body names them, the outputs and the thread attributes the body
    names), as C++ after METAL_AS_CPP, instantiated for ``template``."""
    params = []
    for arg, dtype in inputs:
        params.append(f"const device {METAL_TYPES[dtype]}* {arg}")
        if arg + "_shape" in body:
            params.append(f"const constant int* {arg}_shape")
        if arg + "_strides" in body:
            params.append(f"const constant int64_t* {arg}_strides")
    params += [f"device {METAL_TYPES[dtype]}* {arg}" for arg, dtype in outputs]
    params += [f"{t} {a}" for a, t in METAL_ATTRIBUTES.items() if a in body]
    kinds = ", ".join(
        f"typename {k}" if isinstance(v, str) else f"int {k}" for k, v in template
    )
    values = ", ".join(
        METAL_TYPES[v] if isinstance(v, str) else str(int(v)) for _, v in template
    )
    return (
        METAL_AS_CPP
        + header
        + f"template <{kinds}>\nvoid {name}("
        + ", ".join(params)
        + ") {\n"
        + body
        + f"\n}}\ntemplate void {name}<{values}>("
        + ", ".join(p.rsplit(" ", 1)[0] for p in params)
        + ");\n"
    )


def compile_metal_as_cpp(unit, path):
    """A C++ compiler's syntax and type check of one ``metal_wrap`` unit (C++14, as
    Metal's language is)."""
    path.write_text(unit)
    return subprocess.run(
        ["c++", "-std=c++14", "-fsyntax-only", "-Wno-unknown-pragmas", str(path)],
        capture_output=True,
        text=True,
    )


def compile_unit(unit, arch, path, cubin):
    """nvcc's run on one translation unit written to ``path``, its device code only
    (the binary to ``cubin``), through ptxas as MLX-CUDA's NVRTC builds it."""
    path.write_text(unit)
    output = ["-cubin", "-o", str(cubin)]
    return subprocess.run(
        ["nvcc", "-std=c++17", f"-arch={arch}", *output, "--resource-usage", str(path)],
        capture_output=True,
        text=True,
    )


def code_hash(cubin):
    """The first 16 hex digits of the SHA-256 of a cubin's machine code: its ELF64
    ``.text`` sections' bytes, in the file's order."""
    data = cubin.read_bytes()
    (table,) = struct.unpack_from("<Q", data, 0x28)
    entry, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    # each section header: name offset, type, flags, address, file offset, size, ...
    headers = [
        struct.unpack_from("<IIQQQQ", data, table + i * entry) for i in range(count)
    ]
    names_at = headers[names_index][4]
    digest = hashlib.sha256()
    for name, _, _, _, offset, size in headers:
        if data.startswith(b".text.", names_at + name):
            digest.update(data[offset : offset + size])
    return digest.hexdigest()[:16]


INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
LABEL = re.compile(r"^(\.L_x_\d+):")


def mma_loops(sass):
    """(nesting depth, instructions, MMA instructions, shared loads, local loads and
    stores: spilled registers) of each loop in nvdisasm's listing that holds
    tensor-core instructions, and of each loop inside one (a value sum token by token
    runs once a token, 32 times a tile), in the listing's order. A loop is the body
    between a label and a conditional backward branch to it (the divergence handlers
    at the end jump back unconditionally; they are no loops)."""
    labels, listing = {}, []
    for line in sass.splitlines():
        if m := LABEL.match(line):
            labels[m.group(1)] = len(listing)
        elif m := INSTRUCTION.match(line):
            listing.append(m.group(1))
    spans = []
    for end, text in enumerate(listing):
        target = re.search(r"BRA `\((\.L_x_\d+)\)", text)
        start = labels.get(target.group(1)) if target else None
        if start is not None and start <= end and text.startswith("@"):
            spans.append((start, end))

    def count(body, pattern):
        return sum(re.search(pattern, t) is not None for t in body)

    outer = [(a, b) for a, b in spans if count(listing[a : b + 1], r"\bHMMA\b") > 0]
    loops = []
    for a, b in sorted(spans, key=lambda span: (span[0], -span[1])):
        depth = sum(o[0] <= a and b <= o[1] and o != (a, b) for o in outer)
        if (a, b) not in outer and depth == 0:
            continue
        body = listing[a : b + 1]
        loops.append(
            (
                depth,
                len(body),
                count(body, r"\bHMMA\b"),
                count(body, r"\bLDS\b"),
                count(body, r"\b(LDL|STL)\b"),
            )
        )
    return loops


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument(
        "--every", type=int, default=41, help="compile every n-th attention variant"
    )
    parser.add_argument(
        "--variants",
        type=int,
        nargs="*",
        help="compile these attention variants only (72: the decode benchmark's turbo4)",
    )
    parser.add_argument(
        "--loops",
        action="store_true",
        help="also count the SASS instructions of each tensor-core loop (nvdisasm)",
    )
    parser.add_argument(
        "--nvdisasm", default="nvdisasm", help="the nvdisasm to run for --loops"
    )
    parser.add_argument(
        "--sass",
        type=Path,
        help="with --loops: write each unit's listing to this folder",
    )
    parser.add_argument(
        "--code-hashes",
        action="store_true",
        help="also print a hash of each unit's machine code (see above)",
    )
    parser.add_argument(
        "--simd",
        action="store_true",
        help="compile every n-th variant of the shared SIMD kernels' CUDA build instead",
    )
    parser.add_argument(
        "--metal-as-cpp",
        action="store_true",
        help="with --simd: their Metal build, checked by the C++ compiler instead",
    )
    parser.add_argument(
        "--warps-per-sm",
        type=int,
        help="the decode kernel's launch bounds (decode_attention.WARPS_PER_SM)",
    )
    parser.add_argument(
        "--stage-buffers",
        type=int,
        choices=(0, 1, 2),
        help="its staging buffers a warp (decode_attention.STAGE_BUFFERS)",
    )
    parser.add_argument(
        "--value-mma-max-dim",
        type=int,
        choices=(64, 128, 256),
        help="the largest head dim whose values are summed on the tensor cores "
        "(decode_attention.VALUE_MMA_MAX_DIM)",
    )
    parser.add_argument(
        "--prefill",
        action="store_true",
        help="compile the prefill kernel's variants instead (mma.sync at --arch, "
        "wgmma at sm_90a)",
    )
    args = parser.parse_args()
    if args.prefill:
        failed = 0
        for variant in prefill_variants():
            arch = "sm_90a" if variant[0] else args.arch
            print(
                "wgmma" if variant[0] else "mma.sync", arch, *variant[1:3], variant[4]
            )
            failed |= compile_all([prefill_unit(*variant)], arch)
        sys.exit(failed)
    if args.simd and args.variants is not None:
        parser.error(
            "--variants numbers the fused kernel's variants; with --simd use --every"
        )
    if args.sass and not args.loops:
        parser.error("--sass keeps the listings --loops makes: add --loops")
    if args.metal_as_cpp and not args.simd:
        parser.error("--metal-as-cpp checks the SIMD kernels: add --simd")
    if args.metal_as_cpp and args.code_hashes:
        parser.error("--code-hashes hashes nvcc's builds: leave out --metal-as-cpp")
    if args.simd:
        variants = list(simd_variants())[:: args.every]
        backend = "metal" if args.metal_as_cpp else "cuda"
        units = [unit for v in variants for unit in simd_units(*v, backend=backend)]
        sys.exit(
            compile_all(units, args.arch, args.metal_as_cpp, hashes=args.code_hashes)
        )
    from mlx_lm_turbo.kernels import decode_attention, encode
    from mlx_lm_turbo.kernels.build import source

    if args.warps_per_sm is not None:
        decode_attention.WARPS_PER_SM = args.warps_per_sm
    if args.stage_buffers is not None:
        decode_attention.STAGE_BUFFERS = args.stage_buffers
    if args.value_mma_max_dim is not None:
        decode_attention.VALUE_MMA_MAX_DIM = args.value_mma_max_dim
    header = source("common.cuh")
    variants = list(attention_variants())
    chosen = (
        [variants[i] for i in args.variants]
        if args.variants is not None
        else variants[:: args.every]
    )
    units = [attention_unit(*variant) for variant in chosen]
    encode_body = source("encode.cu")
    for dtype, D, (KB, VB) in (
        list(
            itertools.product(
                ("float16", "float32"), (64, 128, 256), ((4, 4), (3, 3), (2, 8), (0, 4))
            )
        )[:: args.every // 8 or 1]
        if args.variants is None
        else []
    ):
        types = {"keys": dtype, "values": dtype}
        units.append(
            wrap(
                "encode",
                encode_body,
                decode_attention.constants_header(
                    encode.template(dtype, D, KB, VB, True, D == 64)
                )
                + header,
                [(n, types.get(n, "float32")) for n in encode.INPUTS],
                [("rows", "uint32"), ("exact_keys", dtype), ("exact_values", dtype)],
                (),
            )
        )
    if args.loops and shutil.which(args.nvdisasm) is None:
        parser.error(
            f"--loops needs nvdisasm ({args.nvdisasm!r} not found): pip download "
            "nvidia-cuda-nvdisasm, unzip it and pass --nvdisasm DIR/nvidia/cu13/bin/nvdisasm"
        )
    if args.sass:
        args.sass.mkdir(parents=True, exist_ok=True)
    sys.exit(
        compile_all(
            units,
            args.arch,
            nvdisasm=args.loops and args.nvdisasm,
            sass=args.sass,
            hashes=args.code_hashes,
        )
    )


def compile_all(
    units, arch, metal_as_cpp=False, nvdisasm=None, sass=None, hashes=False
):
    """Compile each unit, say how it went (with ``hashes``: its machine code's hash; with
    ``nvdisasm``: its MMA loops, and where ``sass`` names a folder, its listing written
    there); 1 if any failed, else 0."""
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, unit in enumerate(units):
            cubin = Path(tmp) / f"unit{n}.cubin"
            if metal_as_cpp:
                run = compile_metal_as_cpp(unit, Path(tmp) / f"unit{n}.cpp")
            else:
                run = compile_unit(unit, arch, Path(tmp) / f"unit{n}.cu", cubin)
            usage = re.findall(
                r"\d+ bytes stack frame.*|Used \d+ registers.*", run.stderr
            )
            if run.returncode:
                failed += 1
                print(f"unit {n} FAILED:\n{run.stderr[:4000]}")
                continue
            code = f" code {code_hash(cubin)}" if hashes else ""
            print(f"unit {n} ok{code} {usage[-2:]}")
            if nvdisasm:
                listing = subprocess.run(
                    [nvdisasm, "-c", str(cubin)],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                if sass:
                    (sass / f"unit{n}.sass").write_text(listing)
                for depth, size, mma, loads, local in mma_loops(listing):
                    print(
                        f"  {'  ' * depth}loop: {size} instructions, {mma} MMA, "
                        f"{loads} shared loads, {local} local loads and stores"
                    )
    return 1 if failed else 0


if __name__ == "__main__":
    main()
