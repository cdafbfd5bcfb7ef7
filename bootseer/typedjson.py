"""Frozen dataclasses to JSON and back, strictly: what one process hands another.

A server's spec travels from the process that starts it to the server (a pipe, a spare's
socket) as JSON (:mod:`bootseer.serve`). Read back, it is checked whole before any of it
is used: every field present and of its declared type (an ``int`` is no ``bool``, a
``Path`` is a string, a ``float`` is finite), no field unknown. Anything else is a
``ValueError`` naming the field. Field types understood: ``str``, ``bool``, ``int`` (and
its subclasses, such as :class:`bootseer.config.ByteSize`), ``float``, ``Path``,
``tuple[str, ...]``, nested dataclasses, and ``X | None`` of these.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def to_json(obj: Any) -> dict[str, Any]:
    """A dataclass instance as a JSON object (paths as strings, tuples as lists)."""
    return {f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def from_json(cls: type[T], body: Any) -> T:
    """An instance of the dataclass ``cls`` from :func:`to_json`'s object, or ValueError."""
    name = cls.__name__
    if not isinstance(body, dict):
        raise ValueError(f"{name}: expected an object, got {type(body).__name__}")
    hints = typing.get_type_hints(cls)
    wanted = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    unknown = set(body) - {f.name for f in wanted}
    if unknown:
        raise ValueError(f"{name}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    values = {}
    for f in wanted:
        if f.name not in body:
            raise ValueError(f"{name}.{f.name}: missing")
        values[f.name] = _decode(hints[f.name], body[f.name], f"{name}.{f.name}")
    return cls(**values)


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return to_json(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_encode(item) for item in value]
    return value


def _decode(kind: Any, raw: Any, where: str) -> Any:
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if raw is None and type(None) in args:
            return None
        (kind,) = (a for a in args if a is not type(None))
        return _decode(kind, raw, where)
    if typing.get_origin(kind) is tuple:
        if not isinstance(raw, list):
            raise ValueError(f"{where}: expected a list, got {type(raw).__name__}")
        return tuple(_decode(args[0], item, where) for item in raw)
    if dataclasses.is_dataclass(kind):
        return from_json(kind, raw)  # type: ignore[arg-type]
    if kind is bool and isinstance(raw, bool):
        return raw
    if kind is float and isinstance(raw, int | float) and not isinstance(raw, bool) \
            and math.isfinite(raw):
        return float(raw)
    if isinstance(kind, type) and issubclass(kind, int) and kind is not bool \
            and isinstance(raw, int) and not isinstance(raw, bool):
        return kind(raw)
    if kind is str and isinstance(raw, str):
        return raw
    if kind is Path and isinstance(raw, str) and raw and "\0" not in raw:
        return Path(raw)
    if kind not in (bool, float, str, Path) and not (isinstance(kind, type) and
                                                      issubclass(kind, int)):
        raise TypeError(f"{where}: {kind} cannot be read from JSON")
    raise ValueError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {raw!r:.80}")
