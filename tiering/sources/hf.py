"""A Hugging Face Hub repository as a source for ``weightd publish hf://ORG/REPO[@REVISION]`` (design §14).

This module only downloads and checks: the revision is resolved once to its commit SHA, the files of
that commit are listed with the Hub's own hashes (``list_repo_tree``: an LFS file's sha256, every
file's git blob sha1), downloaded by ``huggingface_hub.snapshot_download`` into an HF cache under
``cache_dir`` (parallel, resumable: an interrupted import leaves ``blobs/*.incomplete`` that the next
one continues), and every file is hashed and compared before anyone builds a manifest from it. The
caller publishes the snapshot directory as any other directory, then calls :func:`discard_snapshot`.

``huggingface_hub`` is imported inside the functions, never at module import: only this command pays
for it. Endpoint and token come from where huggingface_hub looks (``HF_ENDPOINT``, ``HF_TOKEN``, its
token file) unless the caller passes them; the token is never put in a message.
"""

from __future__ import annotations

import glob
import hashlib
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import BadInput, IntegrityError, TieringError

SCHEME = "hf://"
DEFAULT_REVISION = "main"
_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_REVISION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
_SHA_RE = re.compile(r"[0-9a-f]{40}")
HASH_BLOCK = 4 << 20


class HubError(TieringError):
    """The Hub refused or failed; exit 1 unless a subclass says otherwise."""


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


class HubHashMismatch(IntegrityError):
    """Downloaded bytes that do not hash to what the Hub lists for the file; exit 5, nothing published."""

    def __init__(self, path: str, algorithm: str, expected: str, actual: str) -> None:
        self.path, self.algorithm, self.expected, self.actual = path, algorithm, expected, actual
        super().__init__(f"{path}: the Hub lists {algorithm} {expected}, the downloaded bytes hash to {actual}")


@dataclass(frozen=True, slots=True)
class HubRef:
    repo_id: str                  # ORG/REPO
    revision: str                 # a branch, tag or commit SHA, as given

    def __str__(self) -> str:
        return f"{SCHEME}{self.repo_id}@{self.revision}"


@dataclass(frozen=True, slots=True)
class HubFile:
    path: str
    size: int
    blob_sha1: str                # the git blob id (of the LFS pointer, for an LFS file)
    sha256: str | None            # an LFS file's content hash, else None


@dataclass(frozen=True, slots=True)
class HubSnapshot:
    ref: HubRef
    commit: str                   # the 40-hex commit SHA the revision named when it was resolved
    files: tuple[HubFile, ...]
    path: Path                    # the snapshot directory (symlinks into the cache's blobs)
    repo_cache: Path              # the repository's directory in the cache (removed by discard_snapshot)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


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


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _translate(exc: BaseException, ref: HubRef, endpoint: str) -> HubError | None:
    """One huggingface_hub (or HTTP client) error as weightd's; None for one that is not the Hub's."""
    from huggingface_hub import errors as hf
    status = _status(exc)
    where = f"{ref} on {endpoint}"
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
        if status == 429:
            return HubRateLimited(f"{where}: rate-limited (429): try again later, or with a token (HF_TOKEN)")
        return HubError(f"{where}: the Hub answered {status}")
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return HubUnreachable(f"{where}: HF_HUB_OFFLINE is set: unset it to import from the Hub")
    if (isinstance(exc, (ConnectionError, TimeoutError, hf.LocalEntryNotFoundError))
            or type(exc).__module__.startswith(("httpx", "httpcore"))):
        return HubUnreachable(f"{where}: the endpoint does not answer ({type(exc).__name__}): check HF_ENDPOINT "
                              f"and the network")
    if isinstance(exc, OSError) and exc.errno is None:   # (a local one, ENOSPC say, keeps its own code)
        return HubError(f"{where}: download failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
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
        sha = api.model_info(ref.repo_id, revision=ref.revision).sha
    except hf.RepositoryNotFoundError as exc:
        if isinstance(exc, (hf.GatedRepoError, hf.RevisionNotFoundError)):
            raise
        try:
            refs = api.list_repo_refs(ref.repo_id)
        except Exception:
            raise exc from None
        names = sorted({r.name for r in (*refs.branches, *refs.tags)})
        raise HubNotFound(f"{ref} on {api.endpoint}: no revision {ref.revision!r} in {ref.repo_id} "
                          f"(its branches and tags: {', '.join(names[:8]) or 'none'})") from None
    if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
        raise HubError(f"{ref} on {api.endpoint}: the Hub answered no commit SHA for {ref.revision!r}")
    return sha


def selected(path: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """As snapshot_download's allow/ignore patterns: any include (all if none), and no exclude."""
    if include and not any(fnmatchcase(path, p) for p in include):
        return False
    return not any(fnmatchcase(path, p) for p in exclude)


def list_files(api: Any, ref: HubRef, commit: str, include: Sequence[str] = (),
               exclude: Sequence[str] = ()) -> tuple[HubFile, ...]:
    """The files of ``commit`` that the globs select, each with the hashes the Hub lists for it."""
    from huggingface_hub.hf_api import RepoFile
    out = []
    for entry in api.list_repo_tree(ref.repo_id, revision=commit, recursive=True):
        if not isinstance(entry, RepoFile) or not selected(entry.path, include, exclude):
            continue
        lfs = entry.lfs
        out.append(HubFile(entry.path, int(entry.size), entry.blob_id, lfs.sha256 if lfs is not None else None))
    if not out:
        raise BadInput(f"{ref} ({commit[:12]}): no file matches --include/--exclude")
    return tuple(sorted(out, key=lambda f: f.path))


def file_digest(path: Path, f: HubFile) -> tuple[str, str, str]:
    """(algorithm, expected, actual) for one downloaded file: sha256 for LFS, git's blob sha1 otherwise."""
    if f.sha256 is not None:
        h, algorithm, expected = hashlib.sha256(), "LFS sha256", f.sha256
    else:
        h, algorithm, expected = hashlib.sha1(usedforsecurity=False), "git blob sha1", f.blob_sha1
        h.update(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as fh:
        while block := fh.read(HASH_BLOCK):
            h.update(block)
    return algorithm, expected, h.hexdigest()


def verify(snapshot: Path, files: Sequence[HubFile], workers: int = 4) -> None:
    """Every file hashed (in parallel: hashlib releases the GIL) against the Hub's hash; the first
    that differs raises HubHashMismatch."""
    def check(f: HubFile) -> None:
        if not (snapshot / f.path).is_file():
            raise HubError(f"{f.path}: listed by the Hub at this commit, but not downloaded")
        algorithm, expected, actual = file_digest(snapshot / f.path, f)
        if actual != expected.lower():
            raise HubHashMismatch(f.path, algorithm, expected, actual)

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="hf-verify") as pool:
        for _ in pool.map(check, files):
            pass


def discard_snapshot(snapshot: HubSnapshot) -> None:
    """Remove the repository's downloads from the cache (after a publish, or bytes that failed)."""
    shutil.rmtree(snapshot.repo_cache, ignore_errors=True)


def fetch_snapshot(ref: HubRef, cache_dir: Path, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
                   endpoint: str | None = None, token: str | None = None, workers: int = 8,
                   progress_bars: bool = False) -> HubSnapshot:
    """Resolve, list, download and verify: a snapshot directory whose every file matched the Hub's hash.

    Bytes that fail their hash are removed from the cache before HubHashMismatch is raised (a retry
    downloads them again); other failures leave the cache as it is, for the next call to resume."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    # huggingface_hub's own bars on a terminal (``progress_bars``); never in a log, which they would flood
    enable_progress_bars() if progress_bars else disable_progress_bars()
    api = HfApi(endpoint=endpoint, token=token)
    with _hub_errors(ref, api.endpoint):
        commit = resolve(api, ref)
        files = list_files(api, ref, commit, include, exclude)
        exact = [glob.escape(f.path) for f in files]   # (each listed path matches itself only)
        path = Path(snapshot_download(ref.repo_id, revision=commit, cache_dir=cache_dir, endpoint=api.endpoint,
                                      token=token, allow_patterns=exact, max_workers=workers))
    repo_cache = Path(cache_dir) / ("models--" + ref.repo_id.replace("/", "--"))
    snapshot = HubSnapshot(ref, commit, files, path, repo_cache)
    try:
        verify(path, files, workers=min(workers, 4))
    except IntegrityError:
        discard_snapshot(snapshot)
        raise
    return snapshot


__all__ = ["DEFAULT_REVISION", "HubAccessDenied", "HubError", "HubFile", "HubHashMismatch", "HubNotFound",
           "HubRateLimited", "HubRef", "HubSnapshot", "HubUnreachable", "SCHEME", "discard_snapshot",
           "fetch_snapshot", "file_digest", "is_hub_ref", "list_files", "parse_hub_ref", "resolve", "selected",
           "verify"]
