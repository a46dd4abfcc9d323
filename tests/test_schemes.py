import pytest

from mlx_lm_turbo import KVScheme, parse_scheme
from mlx_lm_turbo.codec.schemes import valid_scheme_names


@pytest.mark.parametrize(
    "text, expected",
    [
        ("turbo4", KVScheme(4, 4)),
        ("turbo3", KVScheme(3, 3)),
        ("turbo2", KVScheme(2, 2)),
        ("turbo8", KVScheme(8, 8)),
        ("turbo4v2", KVScheme(4, 2)),
        ("turbo0v4", KVScheme(0, 4)),
        ("turbo8v4", KVScheme(8, 4)),
        ("turbo4-compact", KVScheme(4, 4, True)),
        (" TURBO3v4 ", KVScheme(3, 4)),
    ],
)
def test_valid(text, expected):
    scheme = parse_scheme(text)
    assert scheme == expected
    assert parse_scheme(scheme.name) == scheme


@pytest.mark.parametrize("text", ["none", "None", "", None])
def test_off(text):
    assert parse_scheme(text) is None


@pytest.mark.parametrize(
    "text, nearest",
    [
        ("turbo5", "turbo5v3"),
        ("turbo7", "turbo6v2"),
        ("turbo5v5", "turbo5v4"),
        ("turbo1", "turbo2"),
        ("turbo0", "turbo0v4"),
        ("turbo4v0", "turbo4v2"),
        ("turbo4v5", "turbo4"),
        ("q4", "turbo4"),
        ("turbo16", "turbo8"),
        # only canonical ASCII forms are schemes: other digits and leading zeros are near misses
        ("turbo\uff14", "turbo4"),
        ("turbo\u0664", "turbo4"),
        ("turbo04", "turbo4"),
        ("turbo4v02", "turbo4v2"),
        ("turbo4v", "turbo4"),
        ("off", "none"),
        ("fp16", "none"),
        ("turbo4compact", "turbo4-compact"),
    ],
)
def test_invalid_names_nearest_and_lists_forms(text, nearest):
    with pytest.raises(ValueError) as info:
        parse_scheme(text)
    message = str(info.value)
    assert f"Did you mean {nearest}?" in message
    assert "turbo<K>[v<V>][-compact]" in message and "'none'" in message


def test_every_listed_name_parses():
    names = valid_scheme_names()
    assert len(names) == len(set(names))
    for name in names:
        assert parse_scheme(name).name == name


def test_garbage_gets_no_made_up_suggestion():
    with pytest.raises(ValueError) as info:
        parse_scheme("garbage")
    assert "Did you mean" not in str(info.value)


def test_suggestions_never_add_compact_unasked():
    from mlx_lm_turbo.codec.schemes import _nearest_scheme

    for text in ("off", "q8", "turbo9", "turbo8v", "bits8"):
        assert "compact" not in _nearest_scheme(text)
