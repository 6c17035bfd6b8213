"""Loading: which file (``--config``, else ``$WEIGHTD_CONFIG``, else ``/etc/weightd/weightd.toml``
when it exists, else none), read as TOML, merged over the embedded default, validated into a
:class:`Config` that remembers where each key came from. A file it cannot read, an unknown key (with
the key it was probably meant to be) or a bad value is a :class:`ConfigError` naming the key.

The environment is read here only, when :func:`load_config` is called, never at import time: it
picks the file and decides the embedded default's paths (``$HOME``, ``$USER``, the XDG directories).
"""

from __future__ import annotations

import os
import tomllib
from collections import namedtuple
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..errors import ConfigError
from .disjoint import check_disjoint
from .model import BaseModel, ValidationError
from .settings import Settings

SYSTEM_CONFIG = Path("/etc/weightd/weightd.toml")
ENV_CONFIG = "WEIGHTD_CONFIG"


class Config(namedtuple("Config", ["settings", "source", "chosen_by", "file_keys", "env_keys"],
                        defaults=["", frozenset(), ()])):
    """The effective configuration (a Settings) and where it came from (``source``: a file path, or
    "embedded default"; ``chosen_by``: what named the file, ``--config``, ``$WEIGHTD_CONFIG`` or
    ``SYSTEM_CONFIG`` existing; ``file_keys``: the dotted keys the file sets; ``env_keys``: (key,
    variable) for each default the environment decided). Immutable, a named tuple: dataclasses import
    ``inspect``, ~6 ms of the start of ``weightd path`` and ``status``."""
    __slots__ = ()

    def __getattr__(self, name: str) -> Any:  # config.tiers, config.p2p, ...
        if name.startswith("_"):   # (copy, pickle and the like ask for dunders: never the settings)
            raise AttributeError(name)
        return getattr(self.settings, name)


def embedded_defaults(env: Mapping[str, str]) -> dict[str, Any]:
    """Defaults for an unprivileged user: tiers under /dev/shm/weightd-$USER and the XDG dirs."""
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    user = env.get("USER") or env.get("LOGNAME") or _safe_user()
    cache = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    data = Path(env.get("XDG_DATA_HOME") or home / ".local/share")
    state = Path(env.get("XDG_STATE_HOME") or home / ".local/state")
    runtime = env.get("XDG_RUNTIME_DIR")
    state_dir = state / "weightd"
    return {
        "state_dir": str(state_dir),
        "tiers": {
            "hot": {"path": f"/dev/shm/weightd-{user}", "capacity": "50%"},
            "warm": {"path": str(cache / "weightd"), "capacity": "80%"},
            "cold": {"path": str(data / "weightd" / "cold")},
        },
        "api": {"socket": str(Path(runtime) / "weightd.sock") if runtime else str(state_dir / "weightd.sock")},
    }


def _safe_user() -> str:
    """``getpass.getuser()`` without importing getpass (and termios: ~1 ms of every start)."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if user := os.environ.get(name):
            return user
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, OSError):
        return str(os.getuid())


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def _close_key(loc: list[str]) -> str | None:
    """The key of the same table that ``loc``'s last part was probably meant to be (a typo)."""
    import difflib
    import typing
    model: Any = Settings
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        for arg in (ann, *typing.get_args(ann)):  # (X | None: the model inside)
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                model = arg
                break
        else:
            return None
    names = list(getattr(model, "model_fields", {}))
    got = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    return got[0] if got else None


def _first_error(exc: ValidationError) -> tuple[str, str]:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
        near = _close_key([str(p) for p in err["loc"]])
        if near:
            msg += f" (did you mean {near}?)"
    elif err["type"] == "missing":
        msg = "missing key"
    msg = msg.removeprefix("Value error, ")
    return loc, msg


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Find, read, merge over the embedded default, and validate the configuration."""
    env = os.environ if env is None else env
    chosen: Path | None = None
    if path is not None:
        chosen = Path(path)
    elif env.get(ENV_CONFIG):
        chosen = Path(env[ENV_CONFIG])
    elif SYSTEM_CONFIG.exists():
        chosen = SYSTEM_CONFIG
    data: dict[str, Any] = {}
    source = "embedded default"
    chosen_by = "--config" if path is not None else f"${ENV_CONFIG}" if env.get(ENV_CONFIG) else \
        str(SYSTEM_CONFIG) if chosen is not None else ""
    if chosen is not None:
        source = str(chosen)
        try:
            with open(chosen, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(source, "file not found") from None
        except IsADirectoryError:
            raise ConfigError(source, "is a directory") from None
        except PermissionError:
            raise ConfigError(source, "permission denied") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(source, f"invalid TOML: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(source, "not UTF-8 text") from None
    defaults = embedded_defaults(env)
    cold = data.get("tiers", {}).get("cold") if isinstance(data.get("tiers"), Mapping) else None
    if isinstance(cold, Mapping) and "url" in cold:  # an object-store cold tier replaces the default's path
        defaults["tiers"]["cold"].pop("path", None)
    merged = _merge(defaults, data)
    try:
        settings = Settings.model_validate(merged)
    except ValidationError as exc:
        key, msg = _first_error(exc)
        raise ConfigError(source, msg, key) from None
    check_disjoint(settings, source)
    return Config(settings, source, chosen_by, frozenset(_dotted_keys(data)), _env_keys(env))


def _dotted_keys(d: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key a TOML document sets, dotted (a table's own path too)."""
    for k, v in d.items():
        key = f"{prefix}{k}"
        yield key
        if isinstance(v, Mapping):
            yield from _dotted_keys(v, key + ".")


def _env_keys(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(key, variable) for each embedded default that a set environment variable decided (see
    :func:`embedded_defaults`)."""
    def first(*names: str) -> str | None:
        return next((f"${n}" for n in names if env.get(n)), None)
    state = first("XDG_STATE_HOME", "HOME")
    pairs = {"state_dir": state, "tiers.hot.path": first("USER", "LOGNAME"),
             "tiers.warm.path": first("XDG_CACHE_HOME", "HOME"), "tiers.cold.path": first("XDG_DATA_HOME", "HOME"),
             "api.socket": first("XDG_RUNTIME_DIR") or state}
    return tuple((k, v) for k, v in pairs.items() if v)
