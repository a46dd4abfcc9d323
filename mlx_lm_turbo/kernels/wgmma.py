"""Hopper's warpgroup MMA (wgmma) for the prefill kernel: ``wgmma.cuh``'s helpers and
the instructions for the widths a kernel uses, as CUDA text for its header."""

from .build import included


def wgmma_header(widths):
    """``wgmma.cuh`` and, for each N in ``widths``, ``wgmma_ss`` (D += A x B, both in
    shared memory, K-major) and ``wgmma_rs_trans_b`` (D += A x B, A in registers as
    mma.sync's m16n8k16 A fragments of each warp's 16 rows, B in shared memory,
    MN-major) for a 64 x N x 16 product, float16 or bfloat16 into float32."""
    return (
        included("wgmma.cuh")
        + "namespace turbo {\n#ifndef TURBO_PTX_EMULATED\n"
        + "".join(_overloads(n) for n in sorted(set(widths)))
        + "#endif\n}  // namespace turbo\n"
    )


def _overloads(n):
    regs = n // 2
    d = "{" + ", ".join(f"%{i}" for i in range(regs)) + "}"
    outs = ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(regs))
    text = ""
    for name, a_decl, a_inputs, trans in (
        ("wgmma_ss", "uint64_t a", ['"l"(a)'], "0, 0"),
        (
            "wgmma_rs_trans_b",
            "const uint32_t (&a)[4]",
            [f'"r"(a[{i}])' for i in range(4)],
            "1",
        ),
    ):
        # A's operands (a descriptor, or four registers in braces), then B's, then
        # whether to accumulate
        a_operand = ", ".join(f"%{regs + i}" for i in range(len(a_inputs)))
        if len(a_inputs) > 1:
            a_operand = "{" + a_operand + "}"
        b = regs + len(a_inputs)
        text += (
            "template <bool BF16>\n"
            f"__device__ __forceinline__ void {name}(float (&d)[{n // 8}][4], "
            f"{a_decl}, uint64_t b, int accumulate) {{\n"
        )
        for branch, dtype in (("if constexpr (BF16)", "bf16"), ("else", "f16")):
            text += (
                f"  {branch}\n"
                '    asm volatile("{\\n.reg .pred p;\\n'
                f"setp.ne.b32 p, %{b + 1}, 0;\\n"
                f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype} "
                f'{d}, {a_operand}, %{b}, p, 1, 1, {trans};\\n}}\\n"\n'
                f"                 : {outs}\n"
                f'                 : {", ".join(a_inputs)}, "l"(b), "r"(accumulate));\n'
            )
        text += "}\n"
    return text
