"""Every key of the configuration, walked from the settings models: what the reference pages
(scripts/gen_reference.py) document and ``config show`` formats.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any, Iterator

from .model import BaseModel
from .settings import Settings
from .tiers import Capacity


class Key(namedtuple("Key", ["name", "model", "field", "info", "table"])):
    """One configuration key: ``name`` dotted (``tiers.hot.capacity``; a table of ``models`` as
    ``models."NAME"``), the model and field that define it, and ``table``: the model of the table it
    opens (None for a value)."""
    __slots__ = ()


def config_keys(model: Any = None, prefix: str = "") -> Iterator[Key]:
    """Every key of the configuration, tables before their keys, in the models' order: what the
    reference pages document and ``config show`` formats (a key whose ``unit`` is bytes is a size)."""
    import typing
    model = Settings if model is None else model
    model._hints()
    for name, info in model.model_fields.items():
        ann, key = info.annotation, f"{prefix}{name}"
        args = typing.get_args(ann)
        if typing.get_origin(ann) is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            yield Key(key, model, name, info, args[1])
            yield from config_keys(args[1], f'{key}."NAME".')
            continue
        sub = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is None or sub is Capacity:
            yield Key(key, model, name, info, None)
        else:
            yield Key(key, model, name, info, sub)
            yield from config_keys(sub, key + ".")


def size_keys() -> frozenset[str]:
    """The keys that hold a size or a rate in bytes (shown in binary units by ``config show``)."""
    return frozenset(k.name for k in config_keys() if k.info.unit.startswith("bytes"))
