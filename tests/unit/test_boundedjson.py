"""JSON parsed within bounds (``bootseer.boundedjson``): size and nesting refused before
``json.loads`` runs, whatever strings, escapes and encodings hide the brackets."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bootseer.boundedjson import MAX_DEPTH, JSONLimitError, load_file, loads
from bootseer.errors import BootseerError


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def test_data_over_its_limit_or_nesting_is_refused_before_parsing() -> None:
    assert loads(b'{"a": [1, {"b": "[[[[\\"]]"}]}', limit=100, what="x") == \
        {"a": [1, {"b": '[[[["]]'}]}
    with pytest.raises(JSONLimitError, match="the record: 101 bytes"):
        loads(b" " * 101, limit=100, what="the record")
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert _depth(loads(deep, limit=1 << 20, what="x")) == MAX_DEPTH
    for text in ("[" + deep + "]", "[" * 100_000, '{"a":' * 50_000, "[" * sys.getrecursionlimit()):
        with pytest.raises(JSONLimitError, match="nested") as refused:
            loads(text.encode(), limit=1 << 20, what="x")
        assert isinstance(refused.value, ValueError) and isinstance(refused.value, BootseerError)
    assert loads("[[[1]]]", limit=100, what="x", depth=3) == [[[1]]]
    with pytest.raises(JSONLimitError):
        loads("[[[1]]]", limit=100, what="x", depth=2)


def test_brackets_in_strings_do_not_count_and_escapes_cannot_hide_any() -> None:
    quoted = json.dumps(["[" * 1000, "\\" * 999 + "[", '\\"[[[' * 300])
    assert loads(quoted, limit=1 << 20, what="x")[0] == "[" * 1000
    escaped = '["\\\\"' + ',[' * 100 + "]" * 101  # the string ends at its third quote
    with pytest.raises(JSONLimitError):
        loads(escaped, limit=1 << 20, what="x")
    with pytest.raises(ValueError):  # a string that never ends hides nothing it holds
        loads('"' + "[" * 100_000, limit=1 << 20, what="x")


def test_encodings_and_sizes_are_json_loads_own() -> None:
    for encoding in ("utf-8", "utf-8-sig", "utf-16", "utf-32"):
        data = json.dumps({"é": ["x"]}, ensure_ascii=False).encode(encoding)
        assert loads(data, limit=1 << 10, what="x") == {"é": ["x"]}
    with pytest.raises(JSONLimitError):
        loads(("[" * 64).encode("utf-16"), limit=1 << 10, what="x")
    assert loads('"ééé"', limit=8, what="x") == "ééé"  # 8 bytes in UTF-8
    with pytest.raises(JSONLimitError, match="10 bytes"):
        loads('"éééé"', limit=9, what="x")


def test_a_file_is_read_no_further_than_its_limit(tmp_path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"[" + b" " * (10 << 20) + b"]")
    with pytest.raises(JSONLimitError, match="1025 bytes"):
        load_file(path, limit=1 << 10, what="f")
    path.write_text('{"a": 1}')
    assert load_file(path, limit=1 << 10, what="f") == {"a": 1}


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.recursive(st.none() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(alphabet='[]{}"\\', max_size=4), inner,
                                      max_size=3), max_leaves=40),
       st.integers(1, 12))
def test_valid_json_is_refused_exactly_when_it_nests_deeper(value, depth) -> None:
    text = json.dumps(value)
    try:
        assert loads(text, limit=1 << 20, what="x", depth=depth) == value
    except JSONLimitError:
        assert _depth(value) > depth
    else:
        assert _depth(value) <= depth
