"""Fused decode attention over TurboQuant-packed caches (MLX-CUDA; Apple GPUs are handed
to ``decode_attention_simd`` under ``MLX_LM_TURBO_KERNEL=on``).

Computes what ``attention.turbo_scaled_dot_product_attention`` computes from the
same ``TurboKV`` (that portable path is the reference it is tested against), for
queries of 1 to ``MAX_QUERIES`` tokens, without materialising dequantized K/V:

``decode_attention.cu``: one block per (slice of the cached tokens, KV head, group
of query rows). It rotates the query rows once, reads each token's packed codes
and fp16 norms, decodes them against the codebook in shared memory and keeps an
online softmax per row; the exact tokens (sink tokens, the current chunk and the
recent tokens before it) form one more slice, read from their copies in the model's
dtype (at decode the token itself as the model gave it, encoded in the launch). Each
slice writes its unnormalised output rows and their (max, sum) into a workspace that
every launch shares; the last slice of a group to finish merges them (log-sum-exp),
adds a GPT-OSS attention-sink logit, rotates the rows back out of the value rotation
and casts them.

One kernel a layer: on MLX-CUDA each op of a chained decode step costs tens of
microseconds, most of it on the host; a second kernel for the merge was slower.
"""

import math
import threading
import weakref
from functools import lru_cache

import mlx.core as mx

from ..codec.codebooks import boundaries, codebook
from .build import broadcast_rows, cuda_kernel, included, placeholder
from .decode_attention_simd import simd_launch
from .decode_call import (
    ATTENTION_INPUTS,
    MAX_SINKS,
    call_support,
    flags,
    sink_logits,
)
from .dispatch import gpu_backend, layer_served, use_kernel

WARPS = 4
# Each lane accumulates (rows x head_dim / 32) output values in registers: at most 32.
MAX_ROW_VALUES = 1024
# Slicing: at least a tile per warp in each slice, and about this many blocks in all,
# enough to fill the GPU without making the combine long.
MIN_SLICE_TOKENS = 32 * WARPS
# 512 was fastest at 4K and 128K; 1024 is slower, also at one KV head, where parts
# merge by chunks.
TARGET_BLOCKS = 512
# A group of more parts than this merges them by chunks of this many first (the last
# block of each chunk), then the chunks (decode_attention.cu).
MERGE_CHUNK = 16
# A merging block keeps a weight per part and query row in its staging memory (at
# least WARPS * 64 * rows floats): 256 parts, or 256 chunks of them, fit at every head
# dim.
MAX_SLICES = 1023


def fused_decode_attention(queries, kv, scale, mask, sinks=None):
    """The fused kernel's output for this call, or None where the portable path runs
    (or the view's new token is not encoded yet: ``fused_decode_and_encode``)."""
    if (
        kv.pending is not None
        or not use_kernel(kv.codec)
        or call_support(queries, kv, mask) is not None
    ):
        return None
    if gpu_backend() == "metal":  # the simple kernels: Metal cannot run this one
        # checked as they check (use_kernel covers their head dims)
        return simd_launch(queries, kv, scale, mask, sinks, "metal")
    return _cuda_decode_attention(queries, kv, scale, mask, sinks)[0]


def raw_tail_support(codec) -> bool:
    """Whether a decode token of this codec's layer may reach the kernel as the model gave
    it (``fused_decode_and_encode``): the kernels can serve the layer on MLX-CUDA (only
    the CUDA kernel encodes) and its keys are quantized (turbo0vN keeps them as they are,
    in an array of their own). ``MLX_LM_TURBO_KERNEL`` is read once a layer, by the
    launch: under ``off`` it declines and the cache encodes the token as usual."""
    backend = gpu_backend()
    return (
        codec.scheme.key_bits > 0 and backend == "cuda" and layer_served(codec, backend)
    )


def fused_decode_and_encode(queries, kv, scale, mask, sinks=None, in_place=False):
    """(attention output, the new token's packed row (B, H, 1, row words) or None, the
    next step's recent tail or None) from one launch, for a view whose one-token tail
    is as the model gave it (``kv.pending``: its cache checked ``raw_tail_support``);
    None where the kernel does not take the call (the cache then encodes it as usual).
    ``in_place``: the launch also writes the row into the token's slot, the last of
    ``kv.stored``, whose buffer only the cache may hold (MLX knows nothing of that
    write: the layer's next launch reads it, ordered after this one by its ``previous``
    input, as every launch is after the one before; anything else must read the row
    through an op that takes the returned one). With a window of exact recent tokens
    (``kv.recent``: the tokens before this one as a recent tail, ``recent_tail``), the
    launch reads them exactly and returns them one token on, led by the new token's row
    (``tail_row``) instead of returning that row apart."""
    if (
        queries.shape[2] != 1
        or kv.new_keys.shape[2] != 1
        or not use_kernel(kv.codec)  # under MLX_LM_TURBO_KERNEL=off
        or call_support(queries, kv, mask) is not None
    ):
        return None
    outputs = _cuda_decode_attention(
        queries, kv, scale, mask, sinks, raw_tail=True, in_place=in_place
    )
    if kv.recent is None:
        return outputs[0], outputs[1], None
    return outputs[0], None, outputs[1]


def tail_from(codec):
    """Where a recent tail's rows start: after room for a packed row, 16-byte aligned
    (the kernel's TAIL_FROM)."""
    return -(-codec.row_words // 4) * 4


def recent_tail(codec, rows):
    """Recent tokens' rows (B, H, n, 4 x head_dim: key and value in the attention
    domain, then as the model gave them) as a launch reads them: per head, room for a
    packed row, then the rows (uint32 words: B, H, 1, words)."""
    B, H, n, width = rows.shape
    lead = mx.zeros((B, H, 1, tail_from(codec)), mx.uint32)
    return mx.concatenate(
        [lead, mx.view(rows.reshape(B, H, 1, n * width), mx.uint32)], axis=-1
    )


def tail_rows(codec, tail):
    """A recent tail's rows (B, H, n, 4 x head_dim) in the codec's dtype."""
    B, H = tail.shape[:2]
    rows = mx.view(tail[..., tail_from(codec) :], codec.dtype)
    return rows.reshape(B, H, -1, 4 * codec.value_dim)


def tail_row(codec, tail):
    """The packed row (B, H, 1, row words) that leads a launch's recent tail; a row
    alone is its own (slicing it would still be an op)."""
    if tail.shape[-1] == codec.row_words:
        return tail
    return tail[..., : codec.row_words]


# A call's host cost grows with its inputs and template values: the codec's constants
# come as one
# input, the variant's yes/no choices as one template value, and a call passes only the
# inputs its variant reads (``call_inputs``); the header declares the others empty.
INPUTS = (*ATTENTION_INPUTS, "sink_logits", "workspace", "previous", "kmean", "recent")
# The optional inputs by the FLAGS bit that says a call reads them (decode_call.flags);
# "keys" (stored as they are) by the key width instead.
INPUT_FLAGS = {
    "kscale": 1 << 3,
    "sink_keys": 1 << 5,
    "sink_values": 1 << 5,
    "sink_pos": 1 << 5,
    "tail_keys": 1 << 4,
    "tail_values": 1 << 4,
    "sink_logits": 1 << 6,
    "kmean": 1 << 8,
    "recent": 1 << 10,
}
MASK_ARRAY = 2  # FLAGS bits 0-1 of a mask given as an array
# The kernels by their outputs: (raw tail, recent) -> (name, outputs, declarations of
# the outputs a kernel has not). Each output costs the host about 2 us a call, so the
# slices' parts go into the shared workspace, an input, instead.
KERNELS = {
    (False, False): (
        "turbo_decode_attention",
        ("out",),
        "__device__ uint32_t* const new_rows = nullptr;\n"
        "__device__ float* const next_recent = nullptr;\n",
    ),
    (True, False): (
        "turbo_decode_step",
        ("out", "new_rows"),
        "__device__ float* const next_recent = nullptr;\n",
    ),
    (True, True): (
        "turbo_decode_step_recent",
        ("out", "next_recent"),
        "__device__ uint32_t* const new_rows = nullptr;\n",
    ),
}
C_TYPES = {  # an input's C type by its dtype's name
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float32": "float",
    "bool": "bool",
    "uint32": "uint32_t",
    "int32": "int32_t",
}


def call_inputs(key_bits, flag_bits):
    """The inputs a call of this variant passes, in ``INPUTS`` order."""

    def read(name):
        if name == "keys":
            return not key_bits
        if name == "mask":
            return flag_bits & 3 == MASK_ARRAY
        if name in INPUT_FLAGS:
            return flag_bits & INPUT_FLAGS[name] != 0
        return (
            True  # every call passes the queries, constants, rows, workspace, previous
        )

    return tuple(name for name in INPUTS if read(name))


def absent_inputs(names, dtype, mask_dtype):
    """Declarations standing for the inputs a call does not pass (``names`` are those it
    does): a null pointer of the input's type, zero shape and strides. The kernel's code
    names them all, but reads only those its FLAGS say a call passes."""
    T = C_TYPES[dtype]
    types = dict.fromkeys(
        ("keys", "sink_keys", "sink_values", "tail_keys", "tail_values"), T
    )
    types.update(
        sink_pos=C_TYPES["int32"], mask=C_TYPES[mask_dtype], recent=C_TYPES["uint32"]
    )
    return "".join(
        f"__device__ const {types.get(name, 'float')}* const {name} = nullptr;\n"
        f"__device__ constexpr int32_t {name}_shape[4] = {{0, 0, 0, 0}};\n"
        f"__device__ constexpr int64_t {name}_strides[4] = {{0, 0, 0, 0}};\n"
        for name in INPUTS
        if name not in names
    )


# Warps an SM should hold: a block's registers are capped so that 16 warps fit
# (128 registers a thread). Left to itself MLX's compiler gave the kernel 161, so only
# 3 blocks of 4 warps ran per SM and the kernel was a quarter slower at 128K.
WARPS_PER_SM = 16
# Staging buffers each warp holds for its tiles: 0 lets the kernel choose (two, so the
# next tile's copy overlaps this one's reading, where they fit its shared memory); 1 or
# 2 forces it, for experiments (with one, more blocks fit an SM).
STAGE_BUFFERS = 0
# The largest head dim whose values are summed on the tensor cores (else lane by lane).
# At 256 a lane's accumulators take 64 registers and a few spill, but a 32-token tile
# runs about 2,100 instructions against 3,700 lane by lane, and Gemma 3's shape ran
# faster so.
VALUE_MMA_MAX_DIM = 256
# Whether each block records its phases' times at the workspace's end, PHASE_WORDS
# words a block (benchmarks/block_phases.py; decode_attention.cu says what they hold).
PHASE_TIMES = False
PHASE_WORDS = 16
# Copies of the 4-bit (and 3-bit) level-pair tables held side by side in shared memory,
# lane l reading copy l mod PAIR_COPIES (decode_attention.cu says why 16).
PAIR_COPIES = 16


# The widths (key bits, value bits) whose kernel at head dim 128 keeps its 4-bit keys'
# pair table and two staging buffers a warp in dynamic shared memory, where the static
# 48 KiB hold one buffer beside the table (decode_attention.cu: DYNAMIC): those were no
# slower so (turbo4's launch about 1% faster). turbo4v2 (4, 2) builds and computes
# alike (tests/test_kernels.py) but was no faster with it, so it keeps one buffer.
DYNAMIC_WIDTHS = {(4, 4)}


def dynamic_shared(warps, values):
    """The bytes of dynamic shared memory a variant's kernel asks for (its template
    ``values``): 0, but for fp16/bf16 at head dim 128 of DYNAMIC_WIDTHS with at most 4
    query rows a block: its 4-bit level-pair table (16 KiB) and two staging buffers a
    warp. MLX-CUDA raises a kernel's limit of 48 KiB a block only where this is above
    48,000 bytes, so a smaller layout asks for 48,004 (turbo4 takes 50,180); with the
    static arrays (about 6 KiB) 4 blocks of 4 warps still fit an SM's 228 KiB."""
    values = dict(values)
    D, R, key_bits, value_bits = (values[name] for name in ("D", "R", "KB", "VB"))
    if (
        values["T"] == "float32"
        or D != 128
        or key_bits != 4  # the layout holds 4-bit keys' pair table
        or (key_bits, value_bits) not in DYNAMIC_WIDTHS
        or R > 4
        or STAGE_BUFFERS == 1
    ):
        return 0
    row_words = D * (key_bits + value_bits) // 32 + 1  # codes and both norms
    stage_words = max(2 * warps * 32 * row_words, warps * R * D) + 1
    table_bytes = 4 * 256 * PAIR_COPIES  # 256 level pairs (LANE_PAIRS_BYTES)
    return max(table_bytes + 4 * stage_words, 48_004)


def kernel_header(warps, dynamic=0):
    """The header before the kernel's sources: its launch bounds (MLX declares it
    ``__global__ void ...`` after the header, so ``__global__`` is redefined as CUDA's
    own definition, ``__location__(global)``, plus the bounds), then the constants its
    sources read (``dynamic``: ``dynamic_shared``'s bytes)."""
    blocks = max(1, WARPS_PER_SM // warps)
    return (
        "#undef __global__\n"
        f"#define __global__ __location__(global) __launch_bounds__({32 * warps}, {blocks})\n"
        f"constexpr int MAX_SINKS = {MAX_SINKS};\n"
        f"constexpr int STAGE_BUFFERS = {STAGE_BUFFERS};\n"
        f"constexpr int MERGE_CHUNK = {MERGE_CHUNK};\n"
        f"constexpr int VALUE_MMA_MAX_DIM = {VALUE_MMA_MAX_DIM};\n"
        f"constexpr bool PHASE_TIMES = {str(PHASE_TIMES).lower()};\n"
        f"constexpr int PHASE_WORDS = {PHASE_WORDS};\n"
        f"constexpr int PAIR_COPIES = {PAIR_COPIES};\n"
        f"constexpr int DYNAMIC_SHARED = {dynamic};\n"
    )


@lru_cache(maxsize=None)
def _kernel(warps, raw_tail, recent, names, constants):
    """The kernel of a call passing the inputs ``names`` (``call_inputs``), for the
    template values ``constants`` (``template``), which its header declares."""
    name, outputs, no_outputs = KERNELS[raw_tail, recent]
    values = dict(constants)
    dynamic = dynamic_shared(warps, constants)
    return cuda_kernel(
        name,
        list(names),
        list(outputs),
        included("decode_attention.cu"),
        shared_memory=dynamic,
        header=kernel_header(warps, dynamic)
        + constants_header(constants)
        + no_outputs
        + absent_inputs(names, values["T"], values["MT"])
        + included("common.cuh"),
    )


def _most_slices(blocks_per_slice):
    """The most slices ``_slices`` cuts a cache into (once per plan: its groups)."""
    return min(math.ceil(TARGET_BLOCKS / blocks_per_slice), MAX_SLICES)


def _slices(n_tokens, most_slices):
    """How many slices to cut a cache of n_tokens into (the kernel sizes them alike)."""
    return max(1, min(-(-n_tokens // MIN_SLICE_TOKENS), most_slices))


class _Workspace:
    """What the launches a thread builds for queries of one dtype share: the workspace
    (a row of counters, the groups' then their chunks', zero between launches, then
    rows for the slices' parts and their (max, sum), then the chunks') and the last
    launch's output. Each launch takes that output as an input (unread): MLX then
    runs the launches one after another, which could otherwise overlap on the GPU and
    share the workspace. One for every layer: a layer's own would hold memory between
    steps, and an output MLX allocates at every call costs the host more
    (``KERNELS``). One for each thread: launches that threads build on streams of their
    own are not ordered against each other."""

    def __init__(self, dtype):
        self.array = None
        self.previous = placeholder(dtype)
        self.counters = self.part_words = 0  # what the array holds room for

    def fit(self, counters, part_words):
        """Grow the workspace (zeroed) to hold a launch's counters and parts."""
        if counters <= self.counters and part_words <= self.part_words:
            return
        width = max(self.counters, -(-counters // 4) * 4)  # the parts 16-byte aligned
        rows = -(-max(part_words, self.part_words) // width)
        self.array = mx.zeros((1 + rows, width), mx.uint32)
        mx.eval(self.array)  # before any launch, so none fills it
        self.counters, self.part_words = width, rows * width


_THREAD = threading.local()  # .workspaces: query dtype -> this thread's _Workspace


def _workspace(dtype):
    try:
        return _THREAD.workspaces[dtype]
    except AttributeError:
        _THREAD.workspaces = {}
    except KeyError:
        pass
    workspace = _THREAD.workspaces[dtype] = _Workspace(dtype)
    return workspace


class _Layer:
    """What one cache layer's calls share: its constants input (built once per codec and
    scale) and its plans."""

    def __init__(self):
        self.scale = self.consts = None
        self.plans = {}

    def new_plan(self, codec, config):
        """Build and keep the ``_Plan`` of this configuration of calls (its first call;
        later calls find it in ``plans`` themselves, one method call fewer at every
        layer)."""
        plan = self.plans[config] = _Plan(self, codec, *config)
        return plan

    def constants(self, codec, scale):
        if self.scale != scale:
            D = codec.value_dim
            key_bits, value_bits = codec.scheme.key_bits, codec.scheme.value_bits
            parts = [
                codec.key_rotation.signs if key_bits else mx.zeros((D,), mx.float32),
                codec.value_rotation.signs,
                *([codebook(D, key_bits)] if key_bits else []),
                codebook(D, value_bits),
                mx.array([scale], mx.float32),
                *([boundaries(D, key_bits)] if key_bits else []),
                boundaries(D, value_bits),  # for a raw tail's encoding
            ]
            self.consts = mx.concatenate(parts)
            mx.eval(self.consts)
            self.scale = scale
        return self.consts


_LAYERS = weakref.WeakKeyDictionary()  # codec -> _Layer


def forget_kernels():
    """Drop the kernels built so far and the layers' launch plans that hold them, so
    the next call builds them again from this module's constants (for the benchmarks and
    tests that change them)."""
    _kernel.cache_clear()
    _LAYERS.clear()


def _cuda_decode_attention(
    queries, kv, scale, mask, sinks, raw_tail=False, in_place=False
):
    codec = kv.codec
    layer = _LAYERS.get(codec)
    if layer is None:
        layer = _LAYERS[codec] = _Layer()
    shape = queries.shape
    B, n_q_heads, L, D = shape
    *stored_keys, rows = kv.stored  # keys stored as they are (turbo0vN), then the rows
    n_tokens = rows.shape[2]
    recent = kv.recent if raw_tail else None
    if mask is None or (isinstance(mask, str) and L == 1):
        mask_kind, mask_dtype = 0, mx.bool_
    else:
        mask_kind, mask_dtype = (
            (1, mx.bool_) if isinstance(mask, str) else (MASK_ARRAY, mask.dtype)
        )
    config = (
        shape,
        queries.dtype,
        scale,
        mask_kind,
        mask_dtype,
        kv.new_keys is not None,
        kv.sinks is not None,
        sinks is not None,
        kv.window or 0,
        raw_tail,
        in_place,
        None if recent is None else recent.shape,
    )
    plan = layer.plans.get(config) or layer.new_plan(codec, config)
    inputs = plan.inputs.copy()  # the layer's constants; the call's arrays go in below
    at = plan.at
    inputs[0] = queries
    inputs[at["rows"]] = rows
    workspace = _workspace(queries.dtype)
    workspace.fit(plan.counters, plan.part_words)
    inputs[at["workspace"]] = workspace.array
    inputs[at["previous"]] = workspace.previous
    if stored_keys:
        inputs[at["keys"]] = stored_keys[0]
    if kv.sinks is not None:
        first = at["sink_keys"]
        inputs[first : first + 3] = (
            kv.sinks if B == 1 else [broadcast_rows(a, B) for a in kv.sinks]
        )
    if kv.new_keys is not None:
        inputs[at["tail_keys"]] = kv.new_keys
        inputs[at["tail_values"]] = kv.new_values
    if mask_kind == MASK_ARRAY:
        if mask.ndim < 4:  # leading axes of one (a 4-D mask goes as it is)
            mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        inputs[at["mask"]] = mx.broadcast_to(mask, (B, n_q_heads, L, n_tokens))
    if sinks is not None:
        inputs[at["sink_logits"]] = sink_logits(queries, codec, scale, sinks)
    if recent is not None:
        inputs[at["recent"]] = recent
    outputs = plan.kernel(inputs=inputs, **plan.launch(n_tokens))
    workspace.previous = outputs[0]
    return outputs


DTYPE_NAMES = {mx.float16: "float16", mx.bfloat16: "bfloat16", mx.float32: "float32"}


class _Plan:
    """What a layer's calls of one configuration share: the kernel, its template values,
    the launch's groups, which inputs a call passes and where each goes, and the layer's
    constants among them. Built once: on MLX-CUDA the host's time per call is what
    separates a turbo layer from fp16's at short contexts."""

    def __init__(
        self,
        layer,
        codec,
        shape,
        dtype,
        scale,
        mask_kind,
        mask_dtype,
        tail,
        sink_tokens,
        sink_logits,
        window,
        raw_tail,
        in_place,
        recent_shape,
    ):
        B, n_q_heads, L, D = shape
        H = codec.n_kv_heads
        G = n_q_heads // H
        query_rows = min(G * L, MAX_ROW_VALUES // D)
        self.groups = B * H * math.ceil(G * L / query_rows)
        self.has_exact = tail or sink_tokens
        self.most_slices = _most_slices(self.groups)
        self.part_floats = query_rows * (D + 2)
        # the outputs: the attention's, then a raw tail's row, or the recent tail one
        # token on (led by that row)
        self.output_shapes = [shape]
        self.output_dtypes = [dtype]
        if raw_tail:
            row_shape = (B, H, 1, codec.row_words)
            self.output_shapes.append(recent_shape or row_shape)
            self.output_dtypes.append(mx.uint32)
        self.launches = {}
        key_bits = codec.scheme.key_bits
        flag_bits = flags(
            mask_kind,
            mask_dtype == mx.bool_,
            codec.key_scale is not None,
            tail,
            sink_tokens,
            sink_logits,
            raw_tail,
            raw_tail and codec.key_mean is not None,
            in_place,
            recent_shape is not None,
        )
        mask_name = "bool" if mask_dtype == mx.bool_ else DTYPE_NAMES[mask_dtype]
        self.constants = constants = template(
            DTYPE_NAMES[dtype],
            mask_name,
            D,
            G,
            L,
            query_rows,
            key_bits,
            codec.scheme.value_bits,
            WARPS,
            window,
            flag_bits,
        )
        names = call_inputs(key_bits, flag_bits)
        self.at = {name: i for i, name in enumerate(names)}
        self.kernel = _kernel(
            WARPS, raw_tail, recent_shape is not None, names, constants
        )
        # the layer's arrays; the call's own are set per call (None here)
        self.inputs = [None] * len(names)
        self.inputs[self.at["consts"]] = layer.constants(codec, scale)
        # the workspace's room: a counter per group and per chunk of its parts; the
        # parts, each group's query rows x D and their (max, sum), at most
        # ``most_parts`` of them, then the chunks' alike (after up to 3 words that
        # align them)
        most_parts = self.most_slices + self.has_exact
        chunks = -(-most_parts // MERGE_CHUNK) if most_parts > MERGE_CHUNK else 0
        self.counters = self.groups * (1 + chunks)
        self.part_words = self.groups * (most_parts + chunks) * self.part_floats + 3
        if PHASE_TIMES:  # the blocks' records, after everything else
            self.part_words += self.groups * most_parts * PHASE_WORDS
        if "kscale" in self.at:
            self.inputs[self.at["kscale"]] = broadcast_rows(codec.key_scale, B)
        if "kmean" in self.at:
            self.inputs[self.at["kmean"]] = broadcast_rows(codec.key_mean, B)
        mx.eval([a for a in self.inputs if a is not None])

    def launch(self, n_tokens):
        """The launch's grid and outputs for calls over n_tokens cached tokens (their
        slices, and the exact tokens' part if any)."""
        n_parts = _slices(n_tokens, self.most_slices) + self.has_exact
        launch = self.launches.get(n_parts)
        if launch is None:
            launch = self.launches[n_parts] = dict(
                grid=(n_parts * 32 * WARPS, self.groups, 1),
                threadgroup=(32 * WARPS, 1, 1),
                output_shapes=self.output_shapes,
                output_dtypes=self.output_dtypes,
            )
        return launch


@lru_cache(maxsize=None)
def template(
    dtype, mask_dtype, D, G, L, R, key_bits, value_bits, warps, window, flag_bits
):
    """A variant's template values (dtypes by name; built once per variant), named as
    the Metal build's (decode_attention_simd.py), which its kernel's header declares
    (``constants_header``)."""
    return (
        ("T", dtype),
        ("MT", mask_dtype),
        ("D", D),
        ("G", G),
        ("L", L),
        ("R", R),
        ("KB", key_bits),
        ("VB", value_bits),
        ("NW", warps),
        ("FLAGS", flag_bits),
        ("WINDOW", window),
    )


def constants_header(values):
    """Template values declared as MLX declares them, but in the header: a plan's kernel
    serves one set of them anyway, and MLX's host cost of a call grows with the values
    it passes."""
    return "".join(
        f"using {name} = {C_TYPES[value]};\n"
        if isinstance(value, str)
        else f"constexpr int {name} = {value};\n"
        for name, value in values
    )
