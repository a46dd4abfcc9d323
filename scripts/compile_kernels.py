"""Compile the CUDA kernels' sources offline with nvcc, as mx.fast.cuda_kernel wraps them.

No GPU needed: catches syntax and template errors before device time is spent.
The stand-in header declares what MLX's JIT header provides (Shape, Strides, fp16 types).

    python scripts/compile_kernels.py [--arch sm_90]
"""

import argparse
import itertools
import re
import subprocess
import sys
import tempfile
from pathlib import Path

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
C_TYPES = {
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float32": "float",
    "bool": "bool",
    "uint32": "uint32_t",
    "int32": "int32_t",
}


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
    from mlx_lm_turbo.kernels.decode_attention import flags, template

    for dtype, D, (G, L), (KB, VB), mask in itertools.product(
        ("float16", "bfloat16", "float32"),
        (64, 128, 256),
        ((4, 1), (1, 1), (4, 8)),
        ((4, 4), (3, 3), (2, 2), (8, 8), (4, 2), (0, 4)),
        (0, 1, 2),
    ):
        R = min(G * L, 1024 // D)
        # a decode token's own encoding in the launch (one token, quantized keys)
        raw_tail = L == 1 and KB > 0 and mask != 2
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
        )
        window = 0 if L == 1 else 1
        yield (
            dtype,
            raw_tail,
            template(dtype, "bool", D, G, L, R, KB, VB, 4, window, flag_bits),
        )


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
        help="compile these attention variants only (54: the decode benchmark's)",
    )
    args = parser.parse_args()
    from mlx_lm_turbo.kernels import decode_attention, encode
    from mlx_lm_turbo.kernels.dispatch import source

    header = source("common.cuh")
    attention_body = source("decode_attention.cu")

    units = []
    variants = list(attention_variants())
    chosen = (
        [variants[i] for i in args.variants]
        if args.variants is not None
        else variants[:: args.every]
    )
    for dtype, raw_tail, template in chosen:
        types = {
            "q": dtype,
            "keys": dtype,
            "rows": "uint32",
            "counters": "uint32",
            "previous": dtype,
            "sink_keys": dtype,
            "sink_values": dtype,
            "sink_pos": "int32",
            "tail_keys": dtype,
            "tail_values": dtype,
            "mask": "bool",
        }
        names = (
            decode_attention.RAW_TAIL_INPUTS if raw_tail else decode_attention.INPUTS
        )
        units.append(
            wrap(
                "attention",
                attention_body,
                decode_attention.launch_bounds(4)
                + decode_attention.HEADER_CONSTANTS
                + ("" if raw_tail else decode_attention.NO_RAW_TAIL)
                + header,
                [(n, types.get(n, "float32")) for n in names],
                [("out", dtype), ("work", "float32")]
                + ([("new_rows", "uint32")] if raw_tail else []),
                template,
            )
        )
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
                header,
                [(n, types.get(n, "float32")) for n in encode.INPUTS],
                [("rows", "uint32"), ("exact_keys", dtype), ("exact_values", dtype)],
                encode.template(dtype, D, KB, VB, True, D == 64),
            )
        )
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, unit in enumerate(units):
            src = Path(tmp) / f"unit{n}.cu"
            src.write_text(unit)
            run = subprocess.run(
                [
                    "nvcc",
                    "-std=c++17",
                    f"-arch={args.arch}",
                    "-c",
                    "-o",
                    "/dev/null",
                    "--resource-usage",
                    str(src),
                ],
                capture_output=True,
                text=True,
            )
            usage = re.findall(r"Used \d+ registers.*", run.stderr)
            if run.returncode:
                failed += 1
                print(f"unit {n} FAILED:\n{run.stderr[:4000]}")
            else:
                print(f"unit {n} ok {usage[:1]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
