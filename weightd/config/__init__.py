"""Configuration: TOML at ``--config``, else ``$WEIGHTD_CONFIG``, else ``/etc/weightd/weightd.toml``,
else an embedded default that works for an unprivileged user with no set-up (design §5).

A file only needs the keys it changes; everything else keeps the embedded default. Unknown keys and
bad values are :class:`ConfigError` naming the key. The environment is read by :mod:`.load` only,
when :func:`load_config` is called, never at import time.

This module is the package's surface: the rest of weightd imports from here (``from weightd.config
import Config, load_config``). A name's module is imported when the name is first used (PEP 562), so
``weightd path`` loads the config without the code that shows it or walks its keys.

    load.py       load_config: which file, read, merged over the embedded default, validated; Config
                  (the settings and where each key came from); errors naming the key
    disjoint.py   check_disjoint: hot, warm, cold and state_dir are four separate directories
    settings.py   Settings, the whole file, and [models."NAME"] (ModelDefaults)
    tiers.py      [tiers.hot], [tiers.warm], [tiers.cold] (TierSettings, Capacity, ColdSettings) and [warm]
    p2p.py        [p2p] and [p2p.tls]
    listeners.py  [api] (the admin socket), [metrics] and [listeners] (every TCP listener's caps)
    trust.py      [trust] (signed checkpoints) and [publish] (the signing key)
    intent.py     [intent] and [intent.prewarm]
    network.py    [network] (weight traffic yields the link to serving traffic)
    values.py     FrozenModel, the base of every table, and the value rules tables share (paths, CIDRs,
                  IP:PORT, groups)
    model.py      the settings models: the part of pydantic's API the tables use, without its start-up cost
    keys.py       config_keys: every key, walked from the models (what the reference pages document)
    show.py       weightd config show (show_config, config_to_dict, config_sources, to_toml) and
                  describe_source, the daemon's start-up line
"""

from __future__ import annotations

import sys
from typing import Any

#: public name -> the module of this package that defines it (or an absolute ``weightd.`` module)
_SURFACE: dict[str, str] = {
    "Config": "load", "ENV_CONFIG": "load", "SYSTEM_CONFIG": "load", "embedded_defaults": "load",
    "load_config": "load", "ConfigError": "weightd.errors",
    "check_disjoint": "disjoint",
    "Settings": "settings", "ModelDefaults": "settings",
    "Capacity": "tiers", "ColdSettings": "tiers", "TierSettings": "tiers", "Tiers": "tiers", "WarmSettings": "tiers",
    "P2PSettings": "p2p", "P2PTLSSettings": "p2p",
    "ApiSettings": "listeners", "ListenerSettings": "listeners", "MetricsSettings": "listeners",
    "PublishSettings": "trust", "TrustSettings": "trust",
    "IntentSettings": "intent", "PrewarmSettings": "intent", "NetworkSettings": "network",
    "Key": "keys", "config_keys": "keys", "size_keys": "keys",
    "config_sources": "show", "config_to_dict": "show", "describe_source": "show", "show_config": "show",
    "to_toml": "show",
}

__all__ = sorted(_SURFACE)


def __getattr__(name: str) -> Any:
    module = _SURFACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    qualified = module if module.startswith("weightd.") else f"{__name__}.{module}"
    __import__(qualified)   # (not importlib.import_module: see tiering._lazy)
    value = getattr(sys.modules[qualified], name)
    globals()[name] = value   # (the next use is a plain attribute)
    return value


def __dir__() -> list[str]:
    return __all__
