"""Signatures: ``[trust]``, the public keys versions are checked against and whether every version
must be signed (``TrustSettings``); ``[publish]``, the key a publish signs with (``PublishSettings``).
A key file that is missing, unreadable or not a usable key is a config error naming it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from .model import Field, field_validator, model_validator
from .values import FrozenModel, abs_path


def _key_file(v: Any) -> Path:
    """A key or certificate file: an absolute path to a regular file that exists and can be read."""
    p = abs_path(v)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise ValueError(f"{p}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{p}: not a regular file")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{p}: not readable by this user")
    return p


class TrustSettings(FrozenModel):
    """Signed checkpoints: with ``require_signature`` every version must carry a model-signing
    signature (``.weightd/model.sig``) by one of ``public_keys`` (PEM public keys or certificates)
    that covers every byte, or it is refused (exit 5)."""
    require_signature: bool = Field(False, doc="every version must carry a signature by one of public_keys that "
                                               "covers every byte, or it is refused (exit 5)")
    public_keys: tuple[Path, ...] = Field((), doc="PEM EC public keys (P-256/384/521) or certificates signatures are "
                                                  "checked against (signed versions are checked even without "
                                                  "require_signature)")

    @field_validator("public_keys", mode="before")
    @classmethod
    def _keys(cls, v: Any) -> tuple[Path, ...]:
        if not isinstance(v, (list, tuple)):
            raise ValueError("expected a list of PEM public key files")
        from tiering import BadInput
        from tiering import load_public_key
        paths = tuple(_key_file(p) for p in v)
        for p in paths:  # a file that is not a usable key is a config error naming it
            try:
                load_public_key(p)
            except BadInput as exc:
                raise ValueError(str(exc).removeprefix("trust.public_keys: ")) from None
        return paths

    @model_validator(mode="after")
    def _usable(self) -> "TrustSettings":
        if self.require_signature and not self.public_keys:
            raise ValueError("require_signature needs at least one file in trust.public_keys")
        return self


class PublishSettings(FrozenModel):
    """Publishing (``weightd publish``)."""
    signing_key: Path | None = Field(None, doc="PEM EC private key every publish signs with when it is not given "
                                               "--sign (weightd keygen makes one)")

    @field_validator("signing_key", mode="before")
    @classmethod
    def _key(cls, v: Any) -> Path | None:
        return None if v is None else _key_file(v)
