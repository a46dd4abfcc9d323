"""Saved prompt-cache files (``--prompt-cache-file``): checked before mlx-lm builds caches from them.

mlx-lm's ``load_prompt_cache`` trusts the file: a truncated file fails inside MLX's
loader, metadata that disagrees with the arrays fails deep inside a cache, and
NaN norms or a wrong offset run and produce garbage. Here every TurboQuant cache
entry is checked against its own metadata (scheme, dims, dtypes, offsets, finite
values) and a bad file is refused with one message naming it and what is wrong.
Corrupted codes look like any others, so saving adds a CRC-32 of the whole file (its
metadata, the model it was made for included, and every entry) and a table of each
TurboQuant entry's layer and shape facts; loading requires the checksum, compares the
entries with the table, and a file that names its model directory with that model.
Files of the previous version (a checksum of the TurboQuant entries alone, no table)
are still read.
"""

import json
import os
import sys
import zlib

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..cache.kv_cache import TurboQuantKVCache
from ..cache.rotating_cache import TurboQuantRotatingKVCache
from ..cache.single import check_format
from ..codec.packing import packed_words
from ..codec.rotation import SIGNS
from ..codec.schemes import parse_scheme
from ..compat import check_mlx_lm_version
from ..errors import PromptCacheFileError, UsageError

TURBO_CLASSES = ("TurboQuantKVCache", "TurboQuantRotatingKVCache")
# In the file's metadata (no dots: mlx-lm nests on them).
CHECKSUM_KEY = "mlx_lm_turbo_checksum"
CONTENTS_KEY = "mlx_lm_turbo_contents"
PREVIOUS_CHECKSUM_KEY = "mlx_lm_turbo_crc32"  # the previous version's
DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
_CACHE_META = {
    "scheme": str,
    "seed": int,
    "layer": int,
    "uncompressed_start": int,
    "sink_tokens": int,
    "offset": int,
}
_ROTATING_META = {"max_size": int, "keep": int, "idx": int}
_CODEC_META = {
    "scheme": str,
    "key_dim": int,
    "value_dim": int,
    "n_kv_heads": int,
    "dtype": str,
    "seed": int,
    "layer": int,
    "key_calibration": str,
}


class _Bad(Exception):
    """What is wrong with one cache entry (the caller names the file and the entry)."""


def read(file_name):
    """(metadata, cache class names, per-entry state lists) as mlx-lm's loader decodes them."""
    if not os.path.isfile(file_name):
        raise PromptCacheFileError(f"Prompt-cache file {file_name} does not exist.")
    try:
        arrays, metadata = mx.load(str(file_name), return_metadata=True)
    except (RuntimeError, ValueError, OSError) as error:
        raise PromptCacheFileError(
            f"Cannot read prompt-cache file {file_name}: it is not a complete safetensors file "
            f"({error}). Make it again with mlx_lm.cache_prompt."
        ) from None
    try:
        metadata, classes, scalars = tree_unflatten(list(metadata.items()))
        for position, kind in scalars[1:]:  # mlx-lm stores non-array leaves as arrays
            if kind == "string":
                arrays[position] = "".join(chr(i) for i in arrays[position].tolist())
            elif kind == "none":
                arrays[position] = None
            elif kind == "scalar":
                arrays[position] = arrays[position].item()
        states = tree_unflatten(list(arrays.items())) if arrays else []
        if not isinstance(classes, list) or len(states) != len(classes):
            raise ValueError("one state per cache class")
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise PromptCacheFileError(
            f"Prompt-cache file {file_name} was not written by mlx-lm's save_prompt_cache ({error}); "
            "make one with mlx_lm.cache_prompt."
        ) from None
    return metadata, classes, states


def _crc(leaves, crc=0):
    for leaf in leaves:
        if isinstance(leaf, (bool, int, float)):  # as mlx-lm saves them
            leaf = mx.array(leaf)
        if isinstance(leaf, mx.array):
            crc = zlib.crc32(memoryview(leaf.reshape(-1).view(mx.uint8)), crc)
        elif isinstance(leaf, str):
            crc = zlib.crc32(leaf.encode(), crc)
    return crc


def previous_checksum(classes, states):
    """The previous version's CRC-32: the TurboQuant entries' arrays and strings."""
    crc = 0
    for name, state in zip(classes, states):
        if name in TURBO_CLASSES:
            crc = _crc((a for a in state if isinstance(a, (mx.array, str))), crc)
    return f"{crc:08x}"


def checksum(metadata, classes, states):
    """CRC-32 of the file's metadata (but the checksum), cache classes and states."""
    text = json.dumps(
        {k: v for k, v in metadata.items() if k != CHECKSUM_KEY}, sort_keys=True
    )
    leaves = [leaf for _, leaf in tree_flatten(list(states))]
    return f"{_crc([text, *classes, *leaves]):08x}"


_FACTS = ("layer", "scheme", "seed", "offset", "max_size", "keep")
_CODEC_FACTS = ("n_kv_heads", "key_dim", "value_dim")


def contents(classes, states):
    """Per entry, None, or a TurboQuant entry's facts: its layer, scheme, seed, offset,
    a ring's size and, once compressed, its heads and head dims."""
    table = []
    for name, state in zip(classes, states):
        if name not in TURBO_CLASSES:
            table.append(None)
            continue
        meta = json.loads(state[0])
        codec = json.loads(meta["codec"]) if meta["codec"] else {}
        table.append(
            {
                **{k: meta[k] for k in _FACTS if k in meta},
                **{k: codec[k] for k in _CODEC_FACTS if k in codec},
            }
        )
    return table


def _meta(text, fields, what):
    try:
        meta = json.loads(text)
    except (TypeError, ValueError):
        raise _Bad(f"its {what} is not JSON") from None
    if not isinstance(meta, dict):
        raise _Bad(f"its {what} is not a JSON object")
    for name, kind in fields.items():
        value = meta.get(name)
        if (
            not isinstance(value, kind)
            or isinstance(value, bool)
            or (kind is int and value < 0)
        ):
            expected = "a non-negative integer" if kind is int else "a string"
            raise _Bad(f"its {what} has {name}={value!r}, expected {expected}")
    return meta


def _scheme(text, what):
    try:
        scheme = parse_scheme(text)
    except ValueError:
        scheme = None
    if scheme is None:
        raise _Bad(f"its {what} names no TurboQuant scheme ({text!r})")
    return scheme


def _array(a, name, shape, dtype=None, finite=False):
    """Check an array against ``shape`` (None entries match anything)."""
    if not isinstance(a, mx.array):
        raise _Bad(f"{name} is missing")
    if a.ndim != len(shape) or any(
        s is not None and s != n for s, n in zip(shape, a.shape)
    ):
        wanted = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise _Bad(f"{name} has shape {tuple(a.shape)}, expected {wanted}")
    if dtype is not None and a.dtype != dtype:
        raise _Bad(f"{name} is {a.dtype}, expected {dtype}")
    if finite and not mx.isfinite(a).all().item():
        raise _Bad(f"{name} holds NaN or infinite values")


def check_entry(class_name, state):
    """Raise ``_Bad`` unless ``state`` is a consistent TurboQuant cache of ``class_name``."""
    if not isinstance(state, list) or len(state) < 5:
        raise _Bad(
            "it does not hold the metadata, statistics and sink arrays of a TurboQuant cache"
        )
    meta_text, mean, scale, sink_keys, sink_values, *stored = state
    rotating = class_name == "TurboQuantRotatingKVCache"
    meta = _meta(
        meta_text, {**_CACHE_META, **(_ROTATING_META if rotating else {})}, "metadata"
    )
    # a version this one cannot continue: refused with the reason
    version = check_format(meta)
    recent_keys = recent_values = None
    if version >= 4:
        _meta(meta_text, {"recent_exact": int}, "metadata")
        if meta["recent_exact"] < 1:
            raise _Bad(
                f"its metadata has recent_exact={meta['recent_exact']}, expected >= 1"
            )
        if len(stored) < 2:
            raise _Bad("it does not hold the recent-token arrays of its format")
        recent_keys, recent_values, *stored = stored
    query_energy = None
    if version >= 5:
        if not isinstance(meta["sink_queries_missing"], bool):
            raise _Bad(
                f"its metadata has sink_queries_missing={meta['sink_queries_missing']!r}, "
                "expected true or false"
            )
        if not stored:
            raise _Bad("it does not hold the query-energy array of its format")
        query_energy, *stored = stored
    scheme = _scheme(meta["scheme"], "metadata")
    if meta["codec"] is None:
        if (
            mean is not None
            or scale is not None
            or sink_keys is not None
            or recent_keys is not None
            or query_energy is not None
        ):
            raise _Bad(
                "it has key statistics, sink or recent tokens or query energies but no "
                "codec"
            )
        _check_uncompressed(meta, stored, rotating)
        return
    codec = _meta(meta["codec"], _CODEC_META, "codec metadata")
    if _scheme(codec["scheme"], "codec metadata") != scheme:
        raise _Bad(
            f"its codec's scheme {codec['scheme']} disagrees with its scheme {scheme.name}"
        )
    dtype = DTYPES.get(codec["dtype"])
    if dtype is None:
        raise _Bad(
            f"its codec's dtype {codec['dtype']!r} is not one of {', '.join(DTYPES)}"
        )
    from ..codec.codebooks import supported_head_dims

    for name in ("key_dim", "value_dim") if scheme.key_bits else ("value_dim",):
        if codec[name] not in supported_head_dims():
            raise _Bad(f"its codec's {name}={codec[name]} has no codebook")
    if codec["n_kv_heads"] < 1:
        raise _Bad("its codec has no KV heads")
    if codec.get("signs") != SIGNS:
        raise _Bad(
            f"its codec's rotation signs {codec.get('signs')!r} are not {SIGNS!r}, "
            "the only ones this version knows"
        )
    tokens = _check_stored(scheme, codec, dtype, stored, meta)
    _check_tokens(meta, tokens, rotating)
    heads, key_dim, value_dim = (
        codec["n_kv_heads"],
        codec["key_dim"],
        codec["value_dim"],
    )
    for a, name in ((mean, "key-mean"), (scale, "key-scale")):
        if scheme.key_bits and a is not None:
            _array(
                a, f"the {name} array", (None, heads, key_dim), mx.float32, finite=True
            )
    if scheme.key_bits and scale is not None and not (scale > 0).all().item():
        raise _Bad("the key-scale array holds scales that are not positive")
    if sink_keys is not None:
        _array(
            sink_keys,
            "the sink-keys array",
            (None, heads, None, key_dim),
            dtype,
            finite=True,
        )
        sinks = sink_keys.shape[2]
        _array(
            sink_values,
            "the sink-values array",
            (sink_keys.shape[0], heads, sinks, value_dim),
            dtype,
            finite=True,
        )
        if sinks > min(meta["sink_tokens"], meta["offset"]):
            raise _Bad(
                f"it keeps {sinks} sink tokens, more than its {min(meta['sink_tokens'], meta['offset'])}"
            )
    if query_energy is not None:
        sinks = 0 if sink_keys is None else sink_keys.shape[2]
        _array(
            query_energy,
            "the query-energy array",
            (None, heads, sinks, key_dim // 2),
            mx.float32,
            finite=True,
        )
    if recent_keys is not None:
        _array(
            recent_keys,
            "the recent-keys array",
            (None, heads, None, key_dim),
            dtype,
            finite=True,
        )
        _array(
            recent_values,
            "the recent-values array",
            (recent_keys.shape[0], heads, recent_keys.shape[2], value_dim),
            dtype,
            finite=True,
        )
        # its last recent_exact - 1 tokens (a window's: at least those it can see)
        most = min(meta["recent_exact"] - 1, meta["offset"])
        least = min(most, meta["max_size"] - 1) if rotating else most
        if not least <= recent_keys.shape[2] <= most:
            raise _Bad(
                f"it keeps {recent_keys.shape[2]} recent tokens, expected "
                + (f"{most}" if least == most else f"{least} to {most}")
            )
    elif version >= 4 and meta["recent_exact"] > 1 and meta["offset"]:
        raise _Bad("it reads recent tokens exactly but keeps no copies of them")


def _check_uncompressed(meta, stored, rotating):
    """A cache still in its uncompressed start holds an mlx-lm cache's state: keys, values
    (buffers with room to grow), offset, and for a ring its keep, size and index."""
    if not stored:
        if meta["offset"]:
            raise _Bad(f"its offset is {meta['offset']} but it stores no tokens")
        return
    expected = 6 if rotating else 3
    if len(stored) != expected:
        raise _Bad(
            f"its uncompressed start holds {len(stored)} entries, expected {expected}"
        )
    _array(
        stored[0], "the uncompressed-keys array", (None, None, None, None), finite=True
    )
    _array(
        stored[1],
        "the uncompressed-values array",
        (*stored[0].shape[:3], None),
        finite=True,
    )
    if stored[2] != meta["offset"] or (
        not rotating and stored[0].shape[2] < meta["offset"]
    ):
        raise _Bad(
            f"its offset is {meta['offset']} but its uncompressed start holds {stored[2]} tokens "
            f"in a buffer of {stored[0].shape[2]}"
        )


def _check_stored(scheme, codec, dtype, stored, meta):
    """Check the compressed token arrays against the codec; how many tokens they hold."""
    heads, key_dim, value_dim = (
        codec["n_kv_heads"],
        codec["key_dim"],
        codec["value_dim"],
    )
    key_words = packed_words(key_dim, scheme.key_bits) if scheme.key_bits else 0
    value_words = packed_words(value_dim, scheme.value_bits)
    layout = [] if scheme.key_bits else [("keys", key_dim, dtype)]
    if meta.get("format", 0) >= 3:  # rows: key codes, value codes, a word of norms
        layout += [("rows", key_words + value_words + 1, mx.uint32)]
    else:
        if scheme.key_bits:
            layout += [
                ("key-codes", key_words, mx.uint32),
                ("key-norms", 1, mx.float16),
            ]
        layout += [
            ("value-codes", value_words, mx.uint32),
            ("value-norms", 1, mx.float16),
        ]
    if not stored and meta["offset"] == 0:
        return 0
    if len(stored) != len(layout):
        raise _Bad(
            f"it stores {len(stored)} token arrays, but {scheme.name} stores {len(layout)} "
            f"({', '.join(name for name, _, _ in layout)})"
        )
    first = stored[0]
    tokens = first.shape[2] if isinstance(first, mx.array) and first.ndim == 4 else 0
    for a, (name, width, kind) in zip(stored, layout):
        _array(
            a,
            f"the {name} array",
            (first.shape[0] if tokens else None, heads, tokens, width),
            kind,
            finite=kind != mx.uint32,
        )
    if layout[-1][0] == "rows":
        norms = stored[-1][..., -1:].view(mx.float16)
        _array(norms, "the norms in the rows array", norms.shape, finite=True)
    return tokens


def _check_tokens(meta, tokens, rotating):
    """The stored token count against the offset (and a ring's size and index)."""
    offset = meta["offset"]
    if rotating:
        size, keep, idx = meta["max_size"], meta["keep"], meta["idx"]
        if size < 1 or keep > size or idx > tokens:
            raise _Bad(
                f"its ring metadata (max_size {size}, keep {keep}, idx {idx}) does not fit its "
                f"{tokens} stored tokens"
            )
        # A ring holds every token until it is full, then at least a window's worth.
        fits = tokens == offset if offset <= size else size <= tokens <= offset
    else:
        fits = tokens == offset
    if not fits:
        raise _Bad(f"its offset is {offset} but it stores {tokens} tokens")


def check(file_name, with_model=False):
    """Refuse a file whose entries disagree with their metadata, the file's contents
    table or its checksum; ``with_model``: or with the model directory its metadata
    names (mlx_lm.cache_prompt's "model"; a hub id is not fetched)."""
    import mlx_lm.models.cache as mlx_cache  # where mlx-lm's loader looks cache classes up

    register_cache_classes()
    metadata, classes, states = read(file_name)
    unknown = sorted(
        {
            name
            for name in classes
            if not isinstance(getattr(mlx_cache, str(name), None), type)
        }
    )
    if unknown:
        raise PromptCacheFileError(
            f"Prompt-cache file {file_name} holds caches of class {', '.join(map(str, unknown))}, which neither "
            "mlx-lm nor mlx-lm-turbo provides (a newer version or another plugin may have written it)."
        )

    def damaged(what):
        return PromptCacheFileError(
            f"Prompt-cache file {file_name} is damaged: {what}. Make it again with "
            "mlx_lm.cache_prompt."
        )

    for i, (name, state) in enumerate(zip(classes, states)):
        if name in TURBO_CLASSES:
            try:
                check_entry(name, state)
            except _Bad as bad:
                raise damaged(f"cache {i} ({name}): {bad}") from None
            continue
        try:
            getattr(mlx_cache, name).from_state(state)
        except (ValueError, TypeError, KeyError, IndexError) as error:
            raise damaged(
                f"cache {i} ({name}): its state does not make a {name} ({error!r})"
            ) from None
    if not any(name in TURBO_CLASSES for name in classes):
        return  # mlx-lm's own caches: mlx-lm's to load
    if CHECKSUM_KEY in metadata:
        _check_contents(metadata, classes, states, damaged)
        if metadata[CHECKSUM_KEY] != checksum(metadata, classes, states):
            raise damaged(
                "its metadata or caches do not match the checksum saved with them"
            )
    elif PREVIOUS_CHECKSUM_KEY in metadata:  # the previous version: the entries alone
        if metadata[PREVIOUS_CHECKSUM_KEY] != previous_checksum(classes, states):
            raise damaged(
                "its TurboQuant caches do not match the checksum saved with them"
            )
    else:
        raise PromptCacheFileError(
            f"Prompt-cache file {file_name} holds TurboQuant caches but no checksum "
            f"({CHECKSUM_KEY}): it was not saved through mlx-lm-turbo, or the checksum "
            "was removed. Make it again with mlx_lm.cache_prompt."
        )
    path = metadata.get("model")
    if with_model and isinstance(path, str) and os.path.isdir(os.path.expanduser(path)):
        from .preflight import load_model

        model, _ = load_model(path, lazy=True)  # no weights read
        _check_model(file_name, path, classes, states, model)


def _check_contents(metadata, classes, states, damaged):
    """The entries against the contents table saved with them."""
    try:
        table = json.loads(metadata.get(CONTENTS_KEY))
    except (TypeError, ValueError):
        raise damaged(f"its contents table ({CONTENTS_KEY}) is missing") from None
    if not isinstance(table, list) or len(table) != len(classes):
        listed = len(table) if isinstance(table, list) else "no"
        raise damaged(
            f"it holds {len(classes)} caches, its contents table lists {listed}"
        )
    for i, (saved, found) in enumerate(zip(table, contents(classes, states))):
        if saved != found:
            differ = sorted(
                k
                for k in {*(saved or {}), *(found or {})}
                if (saved or {}).get(k) != (found or {}).get(k)
            )
            says = ", ".join(f"{k} {(found or {}).get(k)}" for k in differ)
            listed = ", ".join(f"{k} {(saved or {}).get(k)}" for k in differ)
            raise damaged(
                f"cache {i} ({classes[i]}) has {says or 'other facts'}, its contents "
                f"table lists {listed or 'none'} (entries moved or edited)"
            )


def _check_model(file_name, path, classes, states, model):
    """The TurboQuant entries against the caches ``model`` (at ``path``) makes: their
    count, kinds, ring sizes, heads and head dims."""
    from ..plugin.adapters import head_dims, mlx_make_prompt_cache

    def wrong(what):
        return PromptCacheFileError(
            f"Prompt-cache file {file_name} does not fit model {path}: {what}. "
            "Make it again with mlx_lm.cache_prompt for this model."
        )

    caches = mlx_make_prompt_cache(model)
    if len(caches) != len(classes):
        raise wrong(f"it holds {len(classes)} caches, the model makes {len(caches)}")
    dims = head_dims(model) or [None] * len(caches)
    for i, (facts, cache, shape) in enumerate(
        zip(contents(classes, states), caches, dims)
    ):
        if facts is None:
            continue
        kind = type(cache).__name__
        ring = "max_size" in facts
        if kind != ("RotatingKVCache" if ring else "KVCache"):
            raise wrong(f"cache {i} is a {classes[i]}, the model's is a {kind}")
        if ring and facts["max_size"] != cache.max_size:
            raise wrong(
                f"cache {i} keeps a window of {facts['max_size']} tokens, the "
                f"model's {cache.max_size}"
            )
        if shape is not None and "n_kv_heads" in facts:
            held = (facts["n_kv_heads"], facts["key_dim"], facts["value_dim"])
            if held != shape:
                raise wrong(
                    f"cache {i} holds {held[0]} KV heads of dims {held[1]}/{held[2]}, "
                    f"the model's layer {shape[0]} of {shape[1]}/{shape[2]}"
                )


def save_prompt_cache(original, file_name, cache, metadata=None, *args, **kwargs):
    """mlx-lm's ``save_prompt_cache``, with a contents table and a checksum of the whole
    file in the metadata where it holds TurboQuant caches (other arguments, such as
    ones a later mlx-lm adds, passed through)."""
    classes = [type(c).__name__ for c in cache]
    if any(name in TURBO_CLASSES for name in classes):
        states = [c.state for c in cache]
        metadata = {
            **(metadata or {}),
            CONTENTS_KEY: json.dumps(contents(classes, states)),
        }
        metadata[CHECKSUM_KEY] = checksum(metadata, classes, states)
    return original(file_name, cache, metadata, *args, **kwargs)


def describe(cache):
    """'6 x KVCache' or '2 x turbo8, 4 x turbo4': what a loaded prompt cache holds."""
    from collections import Counter

    kinds = Counter(
        c.scheme.name if hasattr(c, "codec") else type(c).__name__ for c in cache
    )
    return ", ".join(f"{n} x {kind}" for kind, n in kinds.items())


def note_scheme_mismatch(file_name, cache, requested):
    """A loaded cache keeps the scheme it was saved with: say so when ``requested`` differs."""
    from ..plugin.adapters import boundary_scheme

    allowed = {requested.name, boundary_scheme(requested).name}
    schemes = {
        c.scheme.name if hasattr(c, "codec") else None
        for c in cache
        if hasattr(c, "codec") or hasattr(c, "keys")
    }
    if schemes and schemes <= allowed:
        return
    print(
        f"[mlx-lm-turbo] {file_name} holds KV caches {describe(cache)}: a loaded prompt cache keeps "
        f"what it was saved with, so --kv-scheme {requested.name} does not change it.",
        file=sys.stderr,
    )


def register_cache_classes():
    """Make saved prompt caches loadable: ``load_prompt_cache`` looks classes up by name in
    mlx-lm's cache module."""
    import mlx_lm.models.cache as mlx_cache

    check_mlx_lm_version()  # never patch an mlx-lm outside the tested range
    for cls in (TurboQuantKVCache, TurboQuantRotatingKVCache):
        setattr(mlx_cache, cls.__name__, cls)


def load_prompt_cache(original, file_name, *args, **kwargs):
    """mlx-lm's ``load_prompt_cache`` after the file is checked; mlx-lm's own failures on
    a file name it too."""
    from .. import settings

    check(file_name, with_model=True)
    try:
        loaded = original(file_name, *args, **kwargs)
    except UsageError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as error:
        raise PromptCacheFileError(
            f"Cannot load prompt-cache file {file_name}: {error}"
        ) from None
    caches = loaded[0] if isinstance(loaded, tuple) else loaded
    recent = max((getattr(c, "recent_exact", 1) for c in caches), default=1)
    if settings.speculative and recent > 1:
        raise PromptCacheFileError(
            f"Prompt-cache file {file_name} was made with --turbo-recent-exact {recent}: its "
            "caches keep exact copies of the last tokens only, so they cannot be trimmed, and "
            "speculative decoding (--draft-model) trims them. Make it with "
            "--turbo-recent-exact 1 to decode it speculatively."
        )
    if settings.active is not None:
        note_scheme_mismatch(file_name, caches, settings.active.scheme)
        typed = settings.active.recent_exact
        if typed not in (None, recent) and any(hasattr(c, "codec") for c in caches):
            print(
                f"[mlx-lm-turbo] {file_name} was made with --turbo-recent-exact {recent}: "
                f"a loaded prompt cache keeps its window, so --turbo-recent-exact {typed} "
                "does not change it.",
                file=sys.stderr,
            )
    return loaded
