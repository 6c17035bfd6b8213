"""A Hugging Face Hub repository as a source for ``weightd publish hf://ORG/REPO[@REVISION]`` (design §14).

This module only downloads and checks: the revision is resolved once to its commit SHA, the files of
that commit are listed with the Hub's own hashes (``list_repo_tree``: an LFS file's sha256, every
file's git blob sha1), downloaded by ``huggingface_hub.snapshot_download`` into an HF cache under
``cache_dir`` (parallel, resumable: an interrupted import leaves ``blobs/*.incomplete`` that the next
one continues), and every file is hashed and compared before anyone builds a manifest from it. The
caller publishes the snapshot directory as any other directory, held to exactly the files checked
(:meth:`HubSnapshot.publishable`, :attr:`HubSnapshot.check`, :meth:`HubSnapshot.unchanged`), then
calls :func:`discard_snapshot`. The cache is keyed by endpoint (:func:`endpoint_cache`).

``huggingface_hub`` is imported inside the functions, never at module import: only this command pays
for it. Endpoint and token come from where huggingface_hub looks (``HF_ENDPOINT``, ``HF_TOKEN``, its
token file) unless the caller passes them; the token is never put in a message, goes over https only
(or http to loopback), and no message shows an endpoint's ``user:password@``.
"""

from __future__ import annotations

import glob
import hashlib
import ipaddress
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from ..content.scan import CheckFn, scan_checkpoint
from ..content.units import format_bytes
from ..errors import BadInput, NoSpace, TieringError
from ..safefs.paths import private_dir
from .hf_files import (HubError, HubFile, Identity, check_scanned, checked_listing, inode_check, prune_snapshot,
                       still_checked, verify)
from .hf_http import READ_TIMEOUT_S, RetriesSpent, asked_wait, bound_requests

SCHEME = "hf://"
DEFAULT_REVISION = "main"
_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_REVISION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
_SHA_RE = re.compile(r"[0-9a-f]{40}")
_ANY_SHA_RE = re.compile(r"[0-9a-fA-F]{40}")


class HubNotFound(HubError, FileNotFoundError):
    """No such repository (or one this token may not see), or no such revision in it; exit 3."""
    exit_code = 3


class HubAccessDenied(HubError):
    """401/403: a gated or private repository the token (if any) does not grant; exit 2."""
    exit_code = 2


class HubRateLimited(HubError):
    """429: the Hub asks to slow down; exit 1 (try again later)."""


class HubUnreachable(HubError):
    """The endpoint does not answer (refused, DNS, TLS, timeout); exit 1."""


class HubNoSpace(NoSpace):
    """The download cache's file system has less free space than the bytes still to download; exit 6."""

    def __init__(self, where: str, need: int, available: int) -> None:
        self.tier, self.need, self.available = "download cache", need, available
        TieringError.__init__(self, f"{where}: {format_bytes(need)} still to download, {format_bytes(available)} "
                                    f"free there: free some space (or publish fewer files: --include/--exclude)")


@dataclass(frozen=True, slots=True)
class HubRef:
    repo_id: str                  # ORG/REPO
    revision: str                 # a branch, tag or commit SHA, as given

    def __str__(self) -> str:
        return f"{SCHEME}{self.repo_id}@{self.revision}"


@dataclass(frozen=True, slots=True)
class HubSnapshot:
    ref: HubRef
    commit: str                   # the 40-hex commit SHA the revision named when it was resolved
    files: tuple[HubFile, ...]
    path: Path                    # the snapshot directory (symlinks into the cache's blobs)
    repo_cache: Path              # the repository's directory in the cache (removed by discard_snapshot)
    checked: Mapping[str, Identity]   # each file's inode as it was hashed (hf_files.Identity)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def publishable(self) -> list[str]:
        """Hold the snapshot directory to exactly the checked files before a publish: what an earlier
        import left there is removed (returned), and a scan must then find each checked inode
        unchanged (FileChanged otherwise)."""
        gone = prune_snapshot(self.path, self.checked)
        check_scanned(scan_checkpoint(self.path), self.checked, str(self.path))
        return gone

    @property
    def check(self) -> CheckFn:
        """The publish's ``check`` hook: only the inodes that were hashed, unchanged."""
        return inode_check(self.path, self.checked)

    def unchanged(self) -> None:
        """After the publish: every checked file still the inode hashed, unchanged (FileChanged)."""
        still_checked(self.path, self.checked)


def is_hub_ref(text: str) -> bool:
    return text.startswith(SCHEME)


def parse_hub_ref(text: str) -> HubRef:
    """``hf://ORG/REPO[@REVISION]`` (the revision defaults to ``main``); BadInput otherwise."""
    if not is_hub_ref(text):
        raise BadInput(f"{text!r}: not an hf:// reference (hf://ORG/REPO[@REVISION])")
    repo_id, _, revision = text[len(SCHEME):].partition("@")
    if not _REPO_RE.fullmatch(repo_id) or ".." in repo_id:
        raise BadInput(f"{text!r}: expected hf://ORG/REPO[@REVISION] (ORG and REPO of [A-Za-z0-9._-])")
    revision = revision or DEFAULT_REVISION
    if not _REVISION_RE.fullmatch(revision) or ".." in revision:
        raise BadInput(f"{text!r}: bad revision {revision!r} (a branch, tag or commit SHA)")
    return HubRef(repo_id, revision)


def shown_endpoint(endpoint: str) -> str:
    """The endpoint as a message may show it: without any ``user:password@``."""
    parts = urlsplit(endpoint)
    if "@" not in parts.netloc:
        return endpoint
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _scrub(text: str) -> str:
    """Any ``scheme://user:password@`` in a third party's message, without its userinfo."""
    return re.sub(r"(//)[^/@\s]*@", r"\1", text)


def check_token_transport(endpoint: str, token: str | None, note: Callable[[str], None]) -> None:
    """A token goes over https only, or over http to this machine (with a warning); BadInput otherwise."""
    parts = urlsplit(endpoint)
    if not token or parts.scheme != "http":
        return
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise BadInput(f"{shown_endpoint(endpoint)}: refusing to send the Hugging Face token over plain http:// "
                       f"(use https://, or unset HF_TOKEN for a mirror that needs none)")
    note(f"warning: {shown_endpoint(endpoint)}: the Hugging Face token goes over plain http:// (loopback only)")


def endpoint_key(endpoint: str) -> str:
    """``endpoint-<16 hex of the sha256 of the endpoint URL>`` (without userinfo or a trailing ``/``)."""
    return "endpoint-" + hashlib.sha256(shown_endpoint(endpoint).rstrip("/").encode()).hexdigest()[:16]


def endpoint_cache(root: Path, endpoint: str) -> Path:
    """The HF cache for one endpoint under ``root`` (:func:`endpoint_key`: files of one repository
    from two Hubs or mirrors never meet), a real 0700 directory of ours (:func:`private_dir`)."""
    return private_dir(root / endpoint_key(endpoint), "the endpoint's download cache")


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _when(retry_after_s: float | None) -> str:
    """When to try again: ``after HH:MM:SS UTC (in N s, as the Hub asks)``, or ``later``."""
    if retry_after_s is None or not 0 <= retry_after_s <= 10**9:
        return "later"
    at = time.strftime("%H:%M:%S", time.gmtime(time.time() + retry_after_s))
    return f"after {at} UTC (in {retry_after_s:g} s, as the Hub asks)"


def _translate(exc: BaseException, ref: HubRef, endpoint: str) -> HubError | None:
    """One huggingface_hub (or HTTP client) error as weightd's; None for one that is not the Hub's."""
    from huggingface_hub import errors as hf
    status = _status(exc)
    where = f"{ref} on {shown_endpoint(endpoint)}"
    if isinstance(exc, RetriesSpent):
        tries = "" if exc.tries == 1 else f", {exc.tries} tries"
        if exc.status == 429:
            from huggingface_hub import get_token
            return HubRateLimited(f"{where}: rate-limited (429{tries}): try again {_when(exc.retry_after_s)}"
                                  f"{'' if get_token() else ', or with a token (HF_TOKEN)'}")
        return HubError(f"{where}: the Hub answered {exc.status} (a server error{tries}): try again "
                        f"{_when(exc.retry_after_s)}")
    if isinstance(exc, hf.LocalEntryNotFoundError) and exc.__cause__ is not None:
        # (hf_hub_download's "cannot find the file in the local cache" over the HEAD request's own error)
        cause = _translate(exc.__cause__, ref, endpoint)
        if cause is not None:
            return cause
    if isinstance(exc, hf.GatedRepoError) or status == 403:
        return HubAccessDenied(f"{where}: access denied ({status or 403}; a gated or private repository: "
                               f"accept its terms on the Hub and set HF_TOKEN, or log in with 'hf auth login')")
    if isinstance(exc, hf.RevisionNotFoundError):
        return HubNotFound(f"{where}: no revision {ref.revision!r} in {ref.repo_id}")
    if isinstance(exc, hf.RepositoryNotFoundError):
        return HubNotFound(f"{where}: no repository {ref.repo_id} (or a private one this token may not "
                           f"see: set HF_TOKEN)")
    if isinstance(exc, hf.HfHubHTTPError) and status is not None:
        if status == 401:
            return HubAccessDenied(f"{where}: unauthorized (401): set HF_TOKEN to a token that may read it")
        if status == 404:
            return HubNotFound(f"{where}: not found (404)")
        wait = asked_wait(getattr(exc, "response").headers)
        if status == 429:
            return HubRateLimited(f"{where}: rate-limited (429): try again {_when(wait)}")
        if status >= 500:
            return HubError(f"{where}: the Hub answered {status} (a server error): try again {_when(wait)}")
        return HubError(f"{where}: the Hub answered {status}")
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return HubUnreachable(f"{where}: HF_HUB_OFFLINE is set: unset it to import from the Hub")
    if (isinstance(exc, (ConnectionError, TimeoutError, hf.LocalEntryNotFoundError))
            or type(exc).__module__.startswith(("httpx", "httpcore"))):
        return HubUnreachable(f"{where}: the endpoint does not answer ({type(exc).__name__}): check HF_ENDPOINT "
                              f"and the network")
    if isinstance(exc, OSError) and exc.errno is None:   # (a local one, ENOSPC say, keeps its own code)
        line = _scrub(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
        return HubError(f"{where}: download failed: {line}")
    return None


@contextmanager
def _hub_errors(ref: HubRef, endpoint: str) -> Iterator[None]:
    try:
        yield
    except TieringError:
        raise
    except Exception as exc:
        mine = _translate(exc, ref, endpoint)
        if mine is None:
            raise
        raise mine from None


def resolve(api: Any, ref: HubRef) -> str:
    """The commit SHA ``ref.revision`` names now (once: everything after asks for that SHA).

    A repository that exists but has no such revision is told apart from a missing repository by
    listing its refs (a mirror may answer both with the Hub's "repository not found")."""
    from huggingface_hub import errors as hf
    try:
        # (model_info passes its own timeout to every request, None by default: never that)
        sha = api.model_info(ref.repo_id, revision=ref.revision, timeout=READ_TIMEOUT_S).sha
    except hf.RepositoryNotFoundError as exc:
        if isinstance(exc, (hf.GatedRepoError, hf.RevisionNotFoundError)):
            raise
        try:
            refs = api.list_repo_refs(ref.repo_id)
        except Exception:
            raise exc from None
        names = sorted({r.name for r in (*refs.branches, *refs.tags)})
        raise HubNotFound(f"{ref} on {shown_endpoint(api.endpoint)}: no revision {ref.revision!r} in {ref.repo_id} "
                          f"(its branches and tags: {', '.join(names[:8]) or 'none'})") from None
    if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
        raise HubError(f"{ref} on {shown_endpoint(api.endpoint)}: the Hub answered no commit SHA for "
                       f"{ref.revision!r}")
    if _ANY_SHA_RE.fullmatch(ref.revision) and sha != ref.revision.lower():
        raise HubError(f"{ref} on {shown_endpoint(api.endpoint)}: the Hub answered commit {sha} for the commit "
                       f"SHA {ref.revision} (a SHA names only itself): refused")
    return sha


def list_files(api: Any, ref: HubRef, commit: str, include: Sequence[str] = (),
               exclude: Sequence[str] = ()) -> tuple[HubFile, ...]:
    """The files of ``commit`` that the globs select, each with the hashes the Hub lists for it, every
    path, size and hash checked (:func:`~tiering.sources.hf_files.checked_listing`)."""
    where = f"{ref} ({commit[:12]})"
    files = checked_listing(api.list_repo_tree(ref.repo_id, revision=commit, recursive=True), where, include, exclude)
    if not files:
        raise BadInput(f"{where}: no file matches --include/--exclude")
    return files


def bytes_to_download(repo_cache: Path, files: Sequence[HubFile]) -> int:
    """What the download still has to write: each file not complete in ``blobs/`` (named by its LFS
    sha256 or git blob id, as huggingface_hub names them), less what its ``.incomplete`` holds."""
    need = 0
    for f in files:
        blob = repo_cache / "blobs" / (f.sha256 or f.blob_sha1)
        try:
            if os.lstat(blob).st_size == f.size:
                continue
        except OSError:
            pass
        try:
            have = os.lstat(f"{blob}.incomplete").st_size
        except OSError:
            have = 0
        need += max(0, f.size - have)
    return need


def check_space(cache: Path, need: int) -> None:
    """HubNoSpace (exit 6) when the cache's file system has less free space than ``need``."""
    st = os.statvfs(cache)
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise HubNoSpace(str(cache), need, free)


def discard_snapshot(snapshot: HubSnapshot) -> None:
    """Remove the repository's downloads from the cache (after a publish, or bytes that failed)."""
    shutil.rmtree(snapshot.repo_cache, ignore_errors=True)


def resolve_commit(ref: HubRef, *, endpoint: str | None = None, token: str | None = None,
                   note: Callable[[str], None] = lambda line: None) -> str:
    """The commit SHA ``ref`` names now, in one request to the Hub (:func:`resolve`), its errors as
    weightd's: what a caller asks before downloading anything (is NAME@<that commit> published yet?).
    The token goes only where :func:`check_token_transport` allows, as for the download."""
    from huggingface_hub import HfApi, get_token
    api = HfApi(endpoint=endpoint, token=token)
    check_token_transport(api.endpoint, token if token is not None else get_token(), note)
    bound_requests(note)
    with _hub_errors(ref, api.endpoint):
        return resolve(api, ref)


def fetch_snapshot(ref: HubRef, cache_dir: Path, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
                   endpoint: str | None = None, token: str | None = None, workers: int = 8,
                   progress_bars: bool = False, note: Callable[[str], None] = lambda line: None,
                   commit: str | None = None) -> HubSnapshot:
    """Resolve (unless ``commit``, a SHA :func:`resolve_commit` gave, is passed), list, download and
    verify: a snapshot directory whose every file matched the Hub's hash.

    The HF cache is ``cache_dir/endpoint-<hash>/`` (:func:`endpoint_cache`). ``note`` is told the
    selection's size before anything is downloaded (and a warning for a token over loopback http).
    Bytes that fail their hash are removed from the cache (that file only) before HubHashMismatch is
    raised; other failures leave the cache as it is, for the next call to resume."""
    from huggingface_hub import HfApi, get_token, snapshot_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    # huggingface_hub's own bars on a terminal (``progress_bars``); never in a log, which they would flood
    enable_progress_bars() if progress_bars else disable_progress_bars()
    api = HfApi(endpoint=endpoint, token=token)
    check_token_transport(api.endpoint, token if token is not None else get_token(),
                          note if commit is None else (lambda line: None))   # (resolve_commit said it)
    bound_requests(note)
    cache = endpoint_cache(Path(cache_dir), api.endpoint)
    repo_cache = cache / ("models--" + ref.repo_id.replace("/", "--"))
    with _hub_errors(ref, api.endpoint):
        commit = commit or resolve(api, ref)
        files = list_files(api, ref, commit, include, exclude)
        need = bytes_to_download(repo_cache, files)
        note(f"{ref}: commit {commit}: {len(files)} file(s), {format_bytes(sum(f.size for f in files))} selected, "
             f"{format_bytes(need)} to download into {cache}")
        check_space(cache, need)
        exact = [glob.escape(f.path) for f in files]   # (each listed path matches itself only)
        path = Path(snapshot_download(ref.repo_id, revision=commit, cache_dir=cache, endpoint=api.endpoint,
                                      token=token, allow_patterns=exact, max_workers=workers))
    if path.name != commit or path.parent != repo_cache / "snapshots":
        raise HubError(f"{ref}: huggingface_hub downloaded into {path}, not {repo_cache}/snapshots/{commit}: refused")
    checked = verify(path, files, workers=min(workers, 4))
    return HubSnapshot(ref, commit, files, path, repo_cache, checked)


__all__ = ["DEFAULT_REVISION", "HubAccessDenied", "HubNoSpace", "HubNotFound", "HubRateLimited", "HubRef",
           "HubSnapshot", "HubUnreachable", "SCHEME", "bytes_to_download", "check_space", "check_token_transport",
           "discard_snapshot", "endpoint_cache", "endpoint_key", "fetch_snapshot", "is_hub_ref", "list_files",
           "parse_hub_ref", "resolve", "resolve_commit", "shown_endpoint"]
