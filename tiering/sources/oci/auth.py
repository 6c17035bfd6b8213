"""Registry credentials as docker and podman keep them, and the two ways a registry asks for them.

Credentials: ``REGISTRY_AUTH_FILE`` (podman, skopeo, buildah), else ``$DOCKER_CONFIG/config.json`` or
``~/.docker/config.json``: the ``auths`` entry for the registry's host (``auth``: base64 of
``user:password``, or ``username``/``password``). Credential helpers (``credsStore``, ``credHelpers``)
are not run. A registry asks with its 401's ``WWW-Authenticate``: ``Basic`` (the credentials on every
request), or ``Bearer realm=...,service=...,scope=...`` (a token from the realm, asked for with the
credentials when there are some, anonymously otherwise, one per repository scope). The password is
never logged nor put in a message. (``c`` below is the :class:`~.client.RegistryClient` asking.)
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

AUTH_FILE_LIMIT = 1 << 20
IO_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str
    source: str        # the file they came from (named in messages; never the password)


@dataclass(frozen=True, slots=True)
class Challenge:
    scheme: str                     # "basic" or "bearer"
    params: dict[str, str]


def auth_files(env: dict[str, str] | None = None) -> list[Path]:
    """Where credentials are looked for, in order."""
    env = dict(os.environ if env is None else env)
    if env.get("REGISTRY_AUTH_FILE"):
        return [Path(env["REGISTRY_AUTH_FILE"])]
    home = Path(env.get("HOME") or "~").expanduser()
    docker = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else home / ".docker"
    out = [docker / "config.json"]
    if env.get("XDG_RUNTIME_DIR"):
        out.append(Path(env["XDG_RUNTIME_DIR"]) / "containers/auth.json")
    return out


def find_credentials(host: str, env: dict[str, str] | None = None) -> Credentials | None:
    """The credentials for ``host`` (host[:port]) from the first auth file that has an entry for it."""
    from .errors import RegistrySetupError
    for path in auth_files(env):
        try:
            with open(path, "rb") as fh:
                raw = fh.read(AUTH_FILE_LIMIT + 1)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise RegistrySetupError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        try:
            if len(raw) > AUTH_FILE_LIMIT:
                raise ValueError("larger than 1 MiB")
            doc = json.loads(raw)
            auths = doc.get("auths", {}) if isinstance(doc, dict) else {}
            if not isinstance(auths, dict):
                raise ValueError("'auths' is not an object")
        except ValueError as exc:
            raise RegistrySetupError(f"{path}: not a registry auth file ({exc})") from None
        for key, entry in auths.items():
            if _host_of(key) != host or not isinstance(entry, dict):
                continue
            user, password = entry.get("username"), entry.get("password")
            if entry.get("auth"):
                try:
                    user, _, password = base64.b64decode(str(entry["auth"]), validate=True).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    raise RegistrySetupError(f"{path}: the 'auth' of {key} is not base64 of user:password") from None
            if user and isinstance(user, str) and isinstance(password, str):
                return Credentials(user, password, str(path))
    return None


def _host_of(key: str) -> str:
    """An ``auths`` key (``host:port``, ``https://host/v1/``...) as host[:port]."""
    key = key.strip()
    if "://" in key:
        key = urlsplit(key).netloc
    return key.split("/", 1)[0].lower()


def basic_header(creds: Credentials) -> str:
    return "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()


def parse_challenge(header: str) -> Challenge | None:
    scheme, _, rest = header.strip().partition(" ")
    scheme = scheme.lower()
    if scheme not in ("basic", "bearer"):
        return None
    return Challenge(scheme, {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)})


def scope(repo: str | None, push: bool) -> str:
    return f"repository:{repo}:{'pull,push' if push else 'pull'}" if repo else ""


def who(c: Any) -> str:
    return f" for user {c.creds.username} (from {c.creds.source})" if c.creds is not None else " (anonymous)"


def refused(c: Any, what: str, challenge: str) -> Exception:
    """A 401 that credentials did not (or cannot) answer: one line saying which."""
    from .errors import RegistrySetupError
    if c.creds is None:
        files = " or ".join(str(p) for p in c.auth_files)
        err = RegistrySetupError(f"{c.url}: {what}: the registry asks for credentials (401) and there are none "
                                 f"for {c.location.host} in {files}: docker login / podman login, or set "
                                 f"REGISTRY_AUTH_FILE")
    else:
        err = RegistrySetupError(f"{c.url}: {what}: the registry refused the credentials of user {c.creds.username} "
                                 f"(from {c.creds.source}) (401): log in again")
    err.kind = "unauthorized"
    return err


def fetch_token(c: Any, ch: Challenge, repo: str | None, push: bool, deadline: float | None,
                what: str) -> str | None:
    """A bearer token from the challenge's realm for ``repo``'s scope (the challenge's own scope when
    it names one); None when the realm answers 401 (the credentials are refused)."""
    from .errors import RegistryError, RegistrySetupError
    import time
    realm = ch.params.get("realm")
    if not realm:
        raise RegistrySetupError(f"{c.url}: {what}: a bearer challenge without a realm")
    u = urlsplit(realm)
    if u.scheme not in ("https", "http") or (u.scheme == "http" and not c.insecure):
        raise RegistrySetupError(f"{c.url}: {what}: the token realm {realm} is not https (set [tiers.cold] insecure "
                                 f"= true only if plain http is meant)")
    query: list[tuple[str, str]] = []
    if ch.params.get("service"):
        query.append(("service", ch.params["service"]))
    wanted = ch.params.get("scope") or scope(repo, push)
    if wanted:
        query.append(("scope", wanted))
    target = (u.path or "/") + "?" + "&".join(x for x in (u.query, urlencode(query)) if x)
    headers = {"User-Agent": "weightd"}
    if c.creds is not None:
        headers["Authorization"] = basic_header(c.creds)
    left = IO_TIMEOUT_S if deadline is None else max(0.1, deadline - time.monotonic())
    conn: Any = (http.client.HTTPSConnection(u.netloc, timeout=min(IO_TIMEOUT_S, left), context=c._tls
                                             or ssl.create_default_context())
                 if u.scheme == "https" else http.client.HTTPConnection(u.netloc, timeout=min(IO_TIMEOUT_S, left)))
    try:
        conn.request("GET", target, headers=headers)
        resp = conn.getresponse()
        body = resp.read(1 << 20)
    except (OSError, http.client.HTTPException) as exc:
        raise RegistrySetupError(f"{c.url}: {what}: the token service {u.netloc} failed ({type(exc).__name__}: "
                                 f"{exc})") from None
    finally:
        conn.close()
    c.stats.count("token")
    if resp.status in (401, 403):
        return None
    if resp.status != 200:
        raise RegistryError(f"{c.url}: {what}: the token service {u.netloc} answered HTTP {resp.status}")
    try:
        doc = json.loads(body)
        token = doc.get("token") or doc.get("access_token")
    except (ValueError, AttributeError):
        token = None
    if not isinstance(token, str) or not token:
        raise RegistryError(f"{c.url}: {what}: the token service {u.netloc} sent no token")
    return token
