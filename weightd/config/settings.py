"""``Settings``, the whole file: ``state_dir`` and one field per table, the tables defined in the
modules named for them; and ``[models."NAME"]``, a checkpoint's default file patterns
(``ModelDefaults``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .intent import IntentSettings
from .listeners import ApiSettings, ListenerSettings, MetricsSettings
from .model import Field, field_validator, model_validator
from .network import NetworkSettings
from .p2p import P2PSettings
from .tiers import Tiers, WarmSettings
from .trust import PublishSettings, TrustSettings
from .values import FrozenModel, abs_path


class ModelDefaults(FrozenModel):
    """``[models."NAME"]`` (NAME may be a glob, ``"meta-llama/*"``): the files a preload of NAME moves
    when its caller names none (``--all`` moves every file): huggingface_hub's allow/ignore patterns."""
    include: list[str] = Field([], doc="patterns of the files a preload of NAME moves when its caller names none "
                                       "(huggingface_hub's allow_patterns)")
    exclude: list[str] = Field([], doc="patterns of the files it leaves out (ignore_patterns)")

    @model_validator(mode="after")
    def _patterns(self) -> "ModelDefaults":
        from tiering import selection_from
        try:
            selection_from(self.include, self.exclude)
        except Exception as exc:  # BadInput: named by the key it came from
            raise ValueError(str(exc).replace("--", "")) from None
        return self


def _model_key(k: str) -> str:
    import re
    if not re.fullmatch(r"[A-Za-z0-9._*?\[\]-]+(?:/[A-Za-z0-9._*?\[\]-]+)?", k):
        raise ValueError(f"models.{k!r}: expected a checkpoint NAME or a glob of names ('org/*')")
    return k


class Settings(FrozenModel):
    """The whole file. Every key: docs/reference/config.md and weightd.toml(5), made from the tables'
    fields (``doc``, ``unit``, bounds) by scripts/gen_reference.py."""
    state_dir: Path = Field(doc="the daemon's state: the database of copies, pins and leases, and the intent ledgers "
                                "(absolute; SIGHUP never switches it, restart for that)")
    tiers: Tiers = Field(doc="the tiers: [tiers.hot], [tiers.warm] and [tiers.cold]")
    p2p: P2PSettings = Field(P2PSettings(), doc="BitTorrent distribution of large checkpoints between nodes")
    warm: WarmSettings = Field(WarmSettings(), doc="page-cache warming")
    api: ApiSettings = Field(doc="the admin socket")
    metrics: MetricsSettings = Field(MetricsSettings(), doc="the metrics and probes listener")
    listeners: ListenerSettings = Field(ListenerSettings(), doc="every TCP listener's connection caps and timeouts")
    trust: TrustSettings = Field(TrustSettings(), doc="signed checkpoints")
    publish: PublishSettings = Field(PublishSettings(), doc="publishing")
    intent: IntentSettings = Field(IntentSettings(), doc="fleet intent: what this node keeps, and prewarming")
    network: NetworkSettings = Field(NetworkSettings(), doc="weight traffic yields the link to serving traffic")
    models: dict[str, ModelDefaults] = Field({}, doc="[models.\"NAME\"] (NAME may be a glob, \"meta-llama/*\"): the "
                                                     "files a preload of NAME moves when its caller names none")

    _path = field_validator("state_dir", mode="before")(abs_path)

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            for k in v:
                _model_key(str(k))
        return v

    def default_selection(self, name: str) -> Any:
        """The configured default patterns of NAME (a ``tiering.Selection``): its own table, else the
        longest glob that matches it, else none."""
        from fnmatch import fnmatchcase

        from tiering import Selection, selection_from
        d = self.models.get(name)
        if d is None:
            globs = sorted((k for k in self.models if fnmatchcase(name, k)), key=len, reverse=True)
            d = self.models[globs[0]] if globs else None
        return Selection() if d is None else selection_from(d.include, d.exclude)
