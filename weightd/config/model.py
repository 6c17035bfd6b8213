"""Frozen, validated settings models for the config: the few parts of pydantic's API the config uses,
at a fraction of its start-up cost (pydantic built the config's models in ~110 ms, on every command
that reads the config, before any work; this builds them in about a millisecond).

What it does, the way pydantic's lax mode does it (the config's tests pin the messages):

- fields from class annotations, with defaults or :func:`Field` (``default``, ``ge``, ``gt``, ``le``, and
  for the reference pages ``doc``, what the key means, and ``unit``; neither is used to validate);
- ``int`` (also from a whole float, a numeric string or a bool), ``float`` (from an int or a numeric
  string), ``bool`` (also ``"yes"``/``"no"``/``"true"``/``"1"``/... and 0/1), ``str``, ``Path``,
  ``tuple[X, ...]``, ``list[X]``, ``dict[str, X]``, ``X | None``, ``Any`` and nested models;
- ``field_validator(*names, mode="before")`` functions run before the type check (their ``ValueError``
  is the message), ``model_validator(mode="after")`` methods once every field is valid;
- unknown keys refused, missing keys refused, instances frozen, ``_private`` attributes settable;
- :class:`ValidationError` with pydantic's ``errors()`` shape (``loc``, ``msg``, ``type``) for the first
  problem, and ``model_dump(mode="json")``.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import SettingsError

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, frozenset)   # (shared, never copied)

_MISSING: Any = object()


ValidationError = _Fail = SettingsError   # (one class: raised with a relative key path, prefixed on the way up)


class _FieldInfo:
    __slots__ = ("default", "ge", "gt", "le", "doc", "unit", "annotation")

    def __init__(self, default: Any = _MISSING, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, doc: str = "", unit: str = "") -> None:
        self.default, self.ge, self.gt, self.le, self.doc, self.unit = default, ge, gt, le, doc, unit
        self.annotation: Any = None


def Field(default: Any = _MISSING, *, ge: float | None = None, gt: float | None = None,  # noqa: N802
          le: float | None = None, doc: str = "", unit: str = "") -> Any:
    """A field's default and bounds; ``doc``: what the key means, ``unit``: what its number counts
    (``bytes``, ``bytes/s``, ``s``...), both shown by docs/reference/config.md and weightd.toml(5)."""
    return _FieldInfo(default, ge, gt, le, doc, unit)


class PrivateAttr:
    def __init__(self, default: Any = None) -> None:
        self.default = default


def ConfigDict(**_kw: Any) -> dict[str, Any]:  # noqa: N802  (frozen and extra="forbid" always)
    return dict(_kw)


class _Before:
    def __init__(self, names: tuple[str, ...], fn: Callable[..., Any], mode: str) -> None:
        self.names, self.fn, self.mode = names, fn, mode


class _After:
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn


def field_validator(*names: str, mode: str = "after") -> Callable[[Any], _Before]:
    """``mode="before"``: the function gets the raw value and returns the value to type-check;
    ``"after"``: it gets the checked value. A classmethod works too."""
    assert mode in ("before", "after")

    def wrap(fn: Any) -> _Before:
        f = fn.__func__ if isinstance(fn, classmethod) else fn
        if isinstance(fn, classmethod):
            return _Before(names, lambda cls, v, _f=f: _f(cls, v), mode)
        return _Before(names, lambda cls, v, _f=f: _f(v), mode)
    return wrap


def model_validator(*, mode: str = "after") -> Callable[[Any], _After]:
    assert mode == "after"
    return _After


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def _coerce(tp: Any, v: Any) -> Any:
    """``v`` as type ``tp``, or _Fail with pydantic's words."""
    if tp is Any:
        return v
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if v is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], v) if len(inner) == 1 else v
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if isinstance(v, tp):
            return v
        if not isinstance(v, Mapping):
            raise _Fail(f"Input should be a valid dictionary or instance of {tp.__name__}", "model_type")
        return tp._validate(v)
    if origin in _CONTAINERS:
        return _CONTAINERS[origin](typing.get_args(tp), v)
    if tp in _SCALARS:
        return _SCALARS[tp](v)
    raise TypeError(f"weightd.config.model: no rule for {tp!r}")


def _tuple(args: tuple[Any, ...], v: Any) -> tuple[Any, ...]:
    if not isinstance(v, (list, tuple)):
        raise _Fail("Input should be a valid tuple", "tuple_type")
    return tuple(_item(args[0], x, i) for i, x in enumerate(v))


def _list(args: tuple[Any, ...], v: Any) -> list[Any]:
    if not isinstance(v, (list, tuple)):
        raise _Fail("Input should be a valid list", "list_type")
    (item,) = args
    return [_item(item, x, i) for i, x in enumerate(v)]


def _dict(args: tuple[Any, ...], v: Any) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        raise _Fail("Input should be a valid dictionary", "dict_type")
    _k, item = args
    return {str(k): _item(item, x, k) for k, x in v.items()}


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    raise _Fail("Input should be a valid boolean, unable to interpret input", "bool_parsing")


def _int(v: Any) -> int:
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise _Fail("Input should be a finite number", "finite_number")
        if not v.is_integer():
            raise _Fail("Input should be a valid integer, got a number with a fractional part", "int_from_float")
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            raise _Fail("Input should be a valid integer, unable to parse string as an integer",
                        "int_parsing") from None
    raise _Fail("Input should be a valid integer", "int_type")


def _float(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            raise _Fail("Input should be a valid number, unable to parse string as a number",
                        "float_parsing") from None
    raise _Fail("Input should be a valid number", "float_type")


def _str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise _Fail("Input should be a valid string", "string_type")


def _path(v: Any) -> Path:
    if isinstance(v, (str, Path)):
        return Path(v)
    raise _Fail("Input is not a valid path", "path_type")


#: the rule for each kind of field: containers by origin (given the type's arguments), scalars by type
_CONTAINERS: dict[Any, Callable[[tuple[Any, ...], Any], Any]] = {tuple: _tuple, list: _list, dict: _dict}
_SCALARS: dict[Any, Callable[[Any], Any]] = {bool: _bool, int: _int, float: _float, str: _str, Path: _path}


def _item(tp: Any, v: Any, where: Any) -> Any:
    try:
        return _coerce(tp, v)
    except _Fail as f:
        raise f.at(where) from None


def _bounds(info: _FieldInfo, v: Any) -> None:
    """pydantic's order (le, then ge, then gt), and NaN-safe: NaN is refused by every bound."""
    if info.le is not None and not v <= info.le:
        raise _Fail(f"Input should be less than or equal to {info.le}", "less_than_equal")
    if info.ge is not None and not v >= info.ge:
        raise _Fail(f"Input should be greater than or equal to {info.ge}", "greater_than_equal")
    if info.gt is not None and not v > info.gt:
        raise _Fail(f"Input should be greater than {info.gt}", "greater_than")


class BaseModel:
    """Subclass with annotated fields; instances are validated on creation and frozen."""
    model_fields: dict[str, _FieldInfo] = {}
    _before: dict[str, list[Callable[..., Any]]] = {}
    _checks: dict[str, list[Callable[..., Any]]] = {}
    _after: list[Callable[[Any], Any]] = []
    _private: dict[str, Any] = {}
    _hints_done: bool = False

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        fields: dict[str, _FieldInfo] = {}
        before: dict[str, list[Callable[..., Any]]] = {}
        checks: dict[str, list[Callable[..., Any]]] = {}
        after: list[Callable[[Any], Any]] = []
        private: dict[str, Any] = {}
        for base in reversed(cls.__mro__[1:]):
            if issubclass(base, BaseModel) and base is not BaseModel:
                fields.update(base.model_fields)
        for name, value in list(vars(cls).items()):
            if isinstance(value, _Before):
                for n in value.names:
                    (before if value.mode == "before" else checks).setdefault(n, []).append(value.fn)
                delattr(cls, name)
            elif isinstance(value, _After):
                after.append(value.fn)
                delattr(cls, name)
            elif isinstance(value, PrivateAttr):
                private[name] = value.default
                delattr(cls, name)
        for name in cls.__dict__.get("__annotations__", {}):
            if name.startswith("_") or name == "model_config":
                continue
            d = cls.__dict__.get(name, _MISSING)
            info = d if isinstance(d, _FieldInfo) else _FieldInfo(d)
            fields[name] = info
            if name in cls.__dict__:
                delattr(cls, name)   # (the class attribute would shadow nothing, but read as a default)
        cls.model_fields, cls._before, cls._checks = fields, before, checks
        cls._after, cls._private = after, private
        cls._hints_done = False

    @classmethod
    def _hints(cls) -> None:
        """Field types, resolved on first use (the annotations are strings under PEP 563)."""
        if cls._hints_done:
            return
        hints: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
                continue
            g = vars(sys.modules[klass.__module__])
            for name, ann in klass.__dict__.get("__annotations__", {}).items():
                if name in cls.model_fields:
                    hints[name] = eval(ann, g) if isinstance(ann, str) else ann  # noqa: S307 (our own source)
        for name, info in cls.model_fields.items():
            info.annotation = hints[name]
        cls._hints_done = True

    def __init__(self, **data: Any) -> None:
        v = type(self)._validate(data)
        object.__setattr__(self, "__dict__", v.__dict__)

    @classmethod
    def model_validate(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise SettingsError(f"Input should be a valid dictionary or instance of {cls.__name__}", "model_type")
        return cls._validate(data)

    @classmethod
    def _validate(cls, data: Mapping[str, Any]) -> Any:
        cls._hints()
        values: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            if name not in data:
                if info.default is _MISSING:
                    raise _Fail("Field required", "missing", (name,))
                d = info.default   # (a default is never validated, as in pydantic; a list or dict is copied)
                values[name] = d.copy() if isinstance(d, (list, dict, set)) else d
                continue
            v = data[name]
            try:
                for fn in cls._before.get(name, ()):
                    v = fn(cls, v)
                v = _coerce(info.annotation, v)
                if info.ge is not None or info.gt is not None or info.le is not None:
                    _bounds(info, v)
                for fn in cls._checks.get(name, ()):
                    v = fn(cls, v)
            except _Fail as f:
                raise f.at(name) from None
            except ValueError as exc:
                raise _Fail(f"Value error, {exc}", "value_error", (name,)) from None
            values[name] = v
        for name in data:
            if name not in cls.model_fields:
                raise _Fail("Extra inputs are not permitted", "extra_forbidden", (name,))
        obj = cls.__new__(cls)
        private = cls._private
        if not all(isinstance(v, _IMMUTABLE) for v in private.values()):
            import copy   # (imported where used: only a mutable private default needs it, no command's start)
            private = copy.deepcopy(private)
        object.__setattr__(obj, "__dict__", {**values, **private})
        for fn in cls._after:
            try:
                obj = fn(obj)
            except ValueError as exc:
                raise _Fail(f"Value error, {exc}", "value_error") from None
        return obj

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_"):
            raise AttributeError(f"{type(self).__name__} is frozen")
        object.__setattr__(self, name, value)

    def _field_values(self) -> tuple[Any, ...]:
        return tuple(self.__dict__.get(k) for k in self.model_fields)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._field_values() == other._field_values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self._field_values()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={self.__dict__.get(k)!r}' for k in self.model_fields)})"

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {k: _dump(self.__dict__.get(k), mode) for k in self.model_fields}


def _dump(v: Any, mode: str) -> Any:
    if isinstance(v, BaseModel):
        return v.model_dump(mode)
    if isinstance(v, Mapping):
        return {k: _dump(x, mode) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        out = [_dump(x, mode) for x in v]
        return out if mode == "json" or isinstance(v, list) else tuple(out)
    if isinstance(v, Path) and mode == "json":
        return str(v)
    return v
