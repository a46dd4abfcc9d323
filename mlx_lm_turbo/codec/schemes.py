"""The scheme grammar: the one place that says which ``--kv-scheme`` values exist.

    turbo<K>[v<V>][-compact]     K in {0, 2, 3, 4, 5, 6, 8}, V in {2, 3, 4, 8}
    none                         compression off

``turbo4`` is 4-bit keys and values, ``turbo4v2`` 4-bit keys and 2-bit values,
``turbo0v4`` keeps keys in fp16 and stores 4-bit values. Keys alone come at 5 and 6
bits: attention's scores need the keys' precision more than its output the values',
so ``turbo5v3`` spends turbo4's bits with less error; a bare ``turbo5`` is refused (the suggestion is turbo5v3). ``-compact`` (the Swift
port's name for compressed-domain decode) is accepted and means the same storage:
this cache never keeps an fp16 copy, and the fused kernels serve every scheme.
"""

import difflib
import re
from dataclasses import dataclass
from typing import Optional

KEY_BITS = (0, 2, 3, 4, 5, 6, 8)
VALUE_BITS = (2, 3, 4, 8)
# Canonical ASCII forms only: no other digits, no leading zeros (turbo04, turbo٤).
_PATTERN = re.compile(r"turbo(0|[1-9][0-9]*)(?:v([1-9][0-9]*))?(-compact)?", re.ASCII)
# What a near miss looks like, for suggestions: any digits, a bare 'v', a missing dash.
_LOOSE = re.compile(r"turbo(\d*)(?:v(\d*))?(-?compact)?")
# Words meaning "no compression" that people try.
_OFF_WORDS = (
    "off",
    "no",
    "false",
    "0",
    "disable",
    "disabled",
    "fp16",
    "bf16",
    "uncompressed",
)


@dataclass(frozen=True)
class KVScheme:
    key_bits: int  # 0 = keys stay in the model's dtype
    value_bits: int
    compact: bool = False

    @property
    def name(self) -> str:
        name = f"turbo{self.key_bits}"
        if self.value_bits != self.key_bits:
            name += f"v{self.value_bits}"
        return name + ("-compact" if self.compact else "")

    def __str__(self):
        return self.name


def valid_scheme_names():
    names = [f"turbo{k}" for k in KEY_BITS if k in VALUE_BITS]
    names += [f"turbo{k}v{v}" for k in KEY_BITS for v in VALUE_BITS if k != v]
    return names + [n + "-compact" for n in names]


def parse_scheme(text) -> Optional[KVScheme]:
    """Parse a scheme name; ``none`` (or ``None``/empty) means no compression."""
    if isinstance(text, KVScheme):
        return text
    if text is None or str(text).strip().lower() in ("", "none"):
        return None
    cleaned = str(text).strip().lower()
    match = _PATTERN.fullmatch(cleaned)
    if match:
        key_bits = int(match.group(1))
        value_bits = int(match.group(2)) if match.group(2) else key_bits
        if key_bits in KEY_BITS and value_bits in VALUE_BITS:
            return KVScheme(key_bits, value_bits, bool(match.group(3)))
    raise ValueError(_unknown_scheme_message(str(text)))


def _nearest_scheme(text):
    cleaned = text.strip().lower()
    if cleaned in _OFF_WORDS:
        return "none"
    match = _LOOSE.fullmatch(cleaned)
    if match:
        requested, value, compact = match.group(1), match.group(2), bool(match.group(3))
    else:  # "q4", "int8", "4bit": the number is the bits meant
        number = re.search(r"\d+", cleaned)
        if number is None:
            close = difflib.get_close_matches(
                cleaned, valid_scheme_names() + ["none"], n=1, cutoff=0.6
            )
            return close[0] if close else None
        requested, value, compact = number.group(), None, "compact" in cleaned

    def nearest(bits, allowed):
        return min(allowed, key=lambda b: (abs(b - bits), b))

    key_bits = 4 if not requested else int(requested)
    key_bits = 0 if key_bits == 0 else nearest(key_bits, [b for b in KEY_BITS if b])
    value_bits = int(value) if value else default_value_bits(key_bits)
    return KVScheme(key_bits, nearest(value_bits, VALUE_BITS), compact).name


def default_value_bits(key_bits):
    """The value width a bare ``turbo<K>`` means: K itself, or for the key-only widths
    (5, 6) the one that keeps turbo4's 8 bits a key-value pair (turbo5v3, turbo6v2)."""
    if not key_bits:
        return 4
    return key_bits if key_bits in VALUE_BITS else 8 - key_bits


def _unknown_scheme_message(text):
    nearest = _nearest_scheme(text)
    hint = f" Did you mean {nearest}?" if nearest else ""
    return (
        f"Unknown KV scheme {text!r}.{hint} Valid schemes are turbo<K>[v<V>][-compact] "
        f"with K in {{{', '.join(map(str, KEY_BITS))}}} (key bits; 0 keeps keys in fp16) "
        f"and V in {{{', '.join(map(str, VALUE_BITS))}}} (value bits), e.g. turbo4, turbo3, "
        "turbo4v2, turbo0v4, turbo8v4, turbo4-compact; or 'none' for no compression."
    )
