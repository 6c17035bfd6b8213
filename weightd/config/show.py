"""Showing the effective config: ``weightd config show`` (``show_config``: TOML with sizes in binary
units and where each value came from; ``config_to_dict``, ``config_sources``), the small TOML writer
it uses (``to_toml``), and the daemon's start-up line (``describe_source``).
"""

from __future__ import annotations

from typing import Any, Mapping

from tiering import parse_size

from .keys import size_keys
from .load import ENV_CONFIG, Config


def describe_source(cfg: Config) -> str:
    """Where the config came from, for the daemon's start-up line: ``/etc/weightd/weightd.toml``,
    ``/srv/w.toml ($WEIGHTD_CONFIG)``, ``/tmp/w.toml (--config)`` or ``embedded default``."""
    if cfg.chosen_by in ("--config", f"${ENV_CONFIG}"):
        return f"{cfg.source} ({cfg.chosen_by})"
    return cfg.source


def config_sources(cfg: Config) -> dict[str, str]:
    """Where each key's value came from: the config file's path, ``environment ($VAR)`` (an embedded
    default the environment decided), or ``default``; by dotted key, as ``config_to_dict`` has them."""
    env = dict(cfg.env_keys)
    out: dict[str, str] = {}

    def walk(d: Mapping[str, Any], prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, Mapping) and v:
                walk(v, key + ".")
            elif key in cfg.file_keys:
                out[key] = cfg.source
            else:
                out[key] = f"environment ({env[key]})" if key in env else "default"
    walk(config_to_dict(cfg), "")
    return out


def show_config(cfg: Config) -> str:
    """``weightd config show``: the effective config as TOML, sizes in binary units, and after each
    key where its value came from. It reads back as the same config: a size that is no whole number
    of tenths of a unit stays in bytes, its binary form in the comment."""
    from tiering import format_bytes
    sources = config_sources(cfg)
    d = config_to_dict(cfg)
    notes: dict[str, str] = {}
    sizes = size_keys()

    def human(t: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in t.items():
            key = f"{prefix}{k}"
            if isinstance(v, Mapping):
                out[k] = human(v, key + ".")
                continue
            note = sources.get(key, "default")
            if key in sizes and isinstance(v, int) and not isinstance(v, bool):
                text = format_bytes(v)
                if parse_size(text) == v:
                    out[k] = text
                else:   # (not a whole number of tenths of a binary unit: exact, so it reads back the same)
                    out[k], note = v, f"{text}; {note}"
            else:
                out[k] = v
            notes[key] = note
        return out
    return to_toml(human(d, ""), notes=notes)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The effective config as plain TOML-able values (sizes in bytes, capacities as written)."""
    d = cfg.settings.model_dump(mode="json")
    for tier in ("hot", "warm"):
        d["tiers"][tier]["capacity"] = str(getattr(cfg.settings.tiers, tier).capacity)
        if d["tiers"][tier]["capacity"].isdigit():
            d["tiers"][tier]["capacity"] = int(d["tiers"][tier]["capacity"])
    return d


def to_toml(d: Mapping[str, Any], *, notes: Mapping[str, str] | None = None) -> str:
    """A small TOML writer for the config's shapes (tables of scalars and lists of scalars);
    ``notes``: a comment after a key's line, by dotted key."""
    import json

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        return json.dumps(str(v))

    lines: list[str] = []

    def table(prefix: str, t: Mapping[str, Any]) -> None:
        scalars = [(k, v) for k, v in t.items() if not isinstance(v, Mapping) and v is not None]  # TOML has no null
        subs = [(k, v) for k, v in t.items() if isinstance(v, Mapping)]
        if prefix and scalars:
            lines.append(f"\n[{prefix}]")
        for k, v in scalars:
            note = (notes or {}).get(f"{prefix}.{k}" if prefix else k)
            lines.append(f"{k} = {scalar(v)}" + (f"  # {note}" if note else ""))
        for k, v in subs:
            table(f"{prefix}.{k}" if prefix else k, v)

    table("", d)
    return "\n".join(lines).lstrip("\n") + "\n"
