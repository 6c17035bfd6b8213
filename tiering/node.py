"""The local data plane of one node: :class:`LocalNode`, a facade over :mod:`tiering.store`.

Every operation here is synchronous and safe to run from several processes at once; the daemon calls
the same methods from worker threads. Nothing half-written is ever visible under ``NAME/VERSION``:
work happens in ``.staging/``, is verified against the manifest, and appears by ``rename``. The
clocks are injected: ``now`` (wall time: leases, access times, staging age) and ``monotonic``
(durations and every deadline).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .content import parse_cache
from .content.names import LABEL_SEP, validate_label, validate_name, validate_version
from .content.select import PARTIAL_TAG, Selection, choose
from .content.signature import TrustPolicy
from .content.units import MAX_SECONDS
from .copy import run_bounded
from .errors import BadInput, CheckpointNotFound, NoSpace
from .layout import COLD, HOT, LOCAL_TIERS, WARM, TierSpec, VersionDir
from .pagecache import WarmOptions
from .safefs import Dir
from .progress import ProgressFn
from .sources.base import Fetcher
from .state import State
from .store.catalog import Catalog
from .store.preload import PlacedFn, Preloader
from .store.publish import PUBLISH_LOCK_TIMEOUT_S, Publisher
from .store.reconcile import Reconciler
from .store.reports import SOURCES, PreloadReport, PublishReport, status, storage_problems
from .store.roots import RefuseFn, TierRoots
from .store.sources import Sources
from .store.trust import Trust
from .store.space import EvictFn, Space
from .versions import read_version

if TYPE_CHECKING:
    from .sources.oci.cold import OciCold
    from .sources.s3.cold import ObjectCold

log = logging.getLogger(__name__)
DEFAULT_LEASE_S = 600.0
__all__ = ["DEFAULT_LEASE_S", "MAX_SECONDS", "PUBLISH_LOCK_TIMEOUT_S", "SOURCES", "LocalNode", "PreloadReport",
           "PublishReport", "check_seconds"]


def check_seconds(key: str, value: float | None, *, allow_zero: bool) -> float | None:
    """A lease or timeout from a caller: finite, not negative, at most a week (NaN and Infinity are
    refused; they would silently mean "no lease" or "pinned forever")."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or isinstance(value, float) and not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero) or value > MAX_SECONDS:
        raise BadInput(f"{key}: expected a finite number of seconds from {'0' if allow_zero else 'more than 0'} "
                       f"to {int(MAX_SECONDS)} (a week), got {_cut(repr(value))}")
    return float(value)


def _cut(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _forward(owner: str, attr: str, doc: str, convert: Callable[[Any], Any] = lambda v: v) -> property:
    """A LocalNode attribute that lives on one of its parts (``owner`` is a dotted path from self)."""
    def part(self: "LocalNode") -> Any:
        obj: Any = self
        for a in owner.split("."):
            obj = getattr(obj, a)
        return obj
    return property(lambda self: getattr(part(self), attr), lambda self, v: setattr(part(self), attr, convert(v)),
                    doc=doc)


class LocalNode:
    """The tiers of one node. Tier roots are opened by descriptor (and checked to be weightd's own)
    when first needed; nothing is created for a query (``status``, ``path``), and cold storage is
    only ever written by ``publish``."""

    def __init__(self, *, hot: TierSpec, warm: TierSpec, cold: "Path | ObjectCold | OciCold", state_dir: Path,
                 now: Callable[[], float] = time.time, copy_threads: int = 2, reconcile: bool = True,
                 warm_options: WarmOptions = WarmOptions(), on_evict: EvictFn | None = None,
                 fetchers: list[Fetcher] | None = None, on_placed: PlacedFn | None = None,
                 monotonic: Callable[[], float] = time.monotonic, trust: TrustPolicy | None = None,
                 on_refuse: RefuseFn | None = None) -> None:
        self.tiers = {HOT: hot, WARM: warm}
        self.cold = cold
        self.now, self.monotonic = now, monotonic
        self.copy_threads = copy_threads
        self.roots = TierRoots(self.tiers, cold)
        self.roots.on_refuse = on_refuse
        for t in LOCAL_TIERS:  # a foreign, loose or symlinked root is refused before anything else
            self.roots.dir(t, create=False)
        self.state = State(state_dir, now=now)
        parse_cache.use(Path(state_dir) / "manifests")
        self.roots.recorded = lambda t: {(r.name, r.version): r.digest for r in self.state.copies(t)}
        self.catalog = Catalog(self.roots, monotonic=monotonic)
        self.space = Space(self.roots, self.state, now=now, remaining=self._remaining, on_evict=on_evict)
        self.reconciler = Reconciler(self.roots, self.state, now=now, copy_threads=copy_threads)
        self.trust = Trust(self.roots, trust, now=now)
        self.publisher = Publisher(self.roots, now=now, monotonic=monotonic, copy_threads=copy_threads,
                                   trust=trust)
        self.preloader = Preloader(self.roots, self.state, self.space,
                                   # fetchers: e.g. P2P, tried after a local copy and before cold
                                   Sources(self.roots, list(fetchers or []), copy_threads=copy_threads,
                                           monotonic=monotonic), self.trust,
                                   now=now, monotonic=monotonic, remaining=self._remaining,
                                   warm_options=warm_options, on_placed=on_placed)
        if reconcile:
            self.reconcile()

    def close(self) -> None:
        self.state.close()
        self.roots.close()

    def __enter__(self) -> "LocalNode":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _remaining(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - self.monotonic())

    # -- hooks and options (kept as attributes: callers set them after construction) ----------------
    on_evict = _forward("space", "on_evict", "EvictFn | None: (tier, ref, reason, bytes) after an eviction")
    on_refuse = _forward("roots", "on_refuse", "RefuseFn | None: (tier, ref, reason) after a removal weightd refused "
                         "(it cannot prove it made the version or the tier root)")
    on_placed = _forward("preloader", "on_placed", "PlacedFn | None: (tier, version) after a placement")
    fetchers = _forward("preloader.sources", "fetchers", "list[Fetcher]: sources tried before cold", list)
    warm_options = _forward("preloader", "warm_options", "WarmOptions: how a warm-tier copy is warmed")

    # -- operations ---------------------------------------------------------------------------------
    def reconcile(self) -> dict[str, Any]:
        """Remove stale staging and trash, adopt complete versions (verified first), forget vanished
        ones. Local tiers only: cold storage is never written here."""
        return self.reconciler.reconcile()

    def publish(self, src: Path, name: str, version: str, *, progress: ProgressFn | None = None,
                sign_key: Path | None = None, signature: bytes | None = None,
                check: Any = None) -> PublishReport:
        """Copy a checkpoint directory (or HF cache snapshot) into cold storage, immutably; signed with
        ``sign_key`` (a PEM EC private key), or carrying ``signature`` (a model-signing bundle made
        elsewhere, checked to cover exactly these bytes). ``check(path, st)``: asked of every inode
        the scan pins (see :func:`~tiering.content.scan.scan_checkpoint`)."""
        return self.publisher.publish(src, name, version, progress=progress, sign_key=sign_key, signature=signature,
                                      check=check)

    def publish_companion(self, src: Path, name: str, version: str, kind: str, key: str, *,
                          progress: ProgressFn | None = None, check: Any = None, sign_key: Path | None = None,
                          signature: bytes | None = None) -> PublishReport:
        """Publish a directory (a compile cache, ...) tied to NAME@VERSION, which must be published,
        and to a ``key`` saying what makes it valid (engine version, GPU, TP size): as
        ``NAME/V~<kind>~<key>`` beside the version, immutable like it; signed as ``NAME@V~<kind>~<key>``
        with ``sign_key`` (where signatures are required, an unsigned companion is refused like an
        unsigned version)."""
        if kind == PARTIAL_TAG:
            raise BadInput(f"--kind: {kind!r} is reserved (partial copies)")
        label = validate_label(f"{validate_version(version)}{LABEL_SEP}{kind}{LABEL_SEP}{key}")
        whole = self.catalog.version(COLD, name, version)
        if whole is None:
            raise CheckpointNotFound(f"{name}@{version}", "not published; a companion belongs to a published version")
        of = {"version": version, "digest": whole.manifest.digest, "kind": kind, "key": key}
        return self.publisher.publish(src, name, label, progress=progress, check=check, of=of, sign_key=sign_key,
                                      signature=signature)

    def preload(self, name: str, version: str | None = None, *, tier: str = HOT, strict: bool = False,
                lease_s: float = DEFAULT_LEASE_S, timeout_s: float | None = None, wait: bool = False,
                progress: ProgressFn | None = None, holder: str | None = None,
                selection: Selection | None = None, companion: tuple[str, str] | None = None,
                warm_for: Sequence[int] = ()) -> PreloadReport:
        """Make NAME@VERSION complete and verified in ``tier`` (hot falls back to warm unless strict).

        ``wait``: if it is not published yet, wait for it (until ``timeout_s``). ``holder``: who the
        lease is for (shown in ``status`` and in a refusal; default: this process). ``selection``:
        only the files it chooses, as a partial copy of its own (``NAME/V~p<hex>``; the version
        itself when it chooses every file). ``companion``: (kind, key) of an artefact published with
        :meth:`publish` ``of=`` for this version (``NAME/V~<kind>~<key>``), instead of the version.
        ``warm_for``: pids of the processes the copy is for (a daemon's caller), whose memory cgroups
        bound what is warmed after placement, beside this process's own.
        """
        if tier not in LOCAL_TIERS:
            raise BadInput(f"tier must be one of {', '.join(LOCAL_TIERS)}")
        lease_s = check_seconds("lease_s", lease_s, allow_zero=True) or 0.0
        timeout_s = check_seconds("timeout_s", timeout_s, allow_zero=False)
        t0 = self.monotonic()
        deadline = None if timeout_s is None else t0 + timeout_s
        return run_bounded(lambda: self._preload(name, version, tier, strict, lease_s, deadline, wait, progress, t0,
                                                 holder, selection, companion, warm_for),
                           deadline=deadline, clock=self.monotonic, what=f"preload of {name}@{version or 'latest'}")

    def _preload(self, name: str, version: str | None, tier: str, strict: bool, lease_s: float,
                 deadline: float | None, wait: bool, progress: ProgressFn | None, t0: float,
                 holder: str | None = None, selection: Selection | None = None,
                 companion: tuple[str, str] | None = None, warm_for: Sequence[int] = ()) -> PreloadReport:
        src = self.wait_published(name, version, deadline) if wait else self.resolve(name, version)
        obj, origin, part = self.object_of(src, selection, companion)
        try:
            report = self.preloader.preload_into(obj, tier, deadline, progress, lease_s, holder, origin)
        except NoSpace as exc:
            if tier != HOT or strict:
                raise
            log.info("hot tier cannot hold name=%s version=%s, falling back to warm: %s", obj.name,
                     obj.version, exc)
            report = self.preloader.preload_into(obj, WARM, deadline, progress, lease_s, holder, origin)
            report.tier_fallback = {"from": HOT, "to": WARM, "reason": str(exc)}
        report.part_of = part
        report.requested_tier = tier
        self.preloader.warm(report, progress, warm_for)
        report.seconds = self.monotonic() - t0
        return report

    def object_of(self, src: VersionDir, selection: Selection | None = None,
                  companion: tuple[str, str] | None = None) -> tuple[VersionDir, VersionDir | None, dict[str, Any] | None]:
        """The local object a request names: (the object, the published version its bytes come from
        when that is another, what it is part of). A selection that keeps every file is the version."""
        if companion is not None:
            kind, key = companion
            label = validate_label(f"{src.version}{LABEL_SEP}{kind}{LABEL_SEP}{key}")
            if kind == PARTIAL_TAG:
                raise BadInput(f"--with: {kind!r} is not a companion kind")
            comp = self.catalog.version(COLD, src.name, label)
            if comp is None:
                raise CheckpointNotFound(f"{src.ref} {kind} {key}", f"no {kind} with key {key!r} is published for "
                                         f"{src.ref} (weightd publish DIR --companion-of {src.ref} --kind {kind} "
                                         f"--key {key})")
            of = comp.manifest.of or {}
            if of.get("digest") != src.manifest.digest:
                raise CheckpointNotFound(f"{src.ref} {kind} {key}", f"the {kind} with key {key!r} was published for "
                                         f"other content of {src.ref} (digest {str(of.get('digest'))[:12]}); "
                                         f"publish it again for this one")
            return comp, None, {"kind": kind, "key": key, "version": src.version, "files": len(comp.manifest.files)}
        if selection is None or selection.whole:
            return src, None, None
        if selection.experts is not None:   # an expert-parallel rank's copy (tiering.experts)
            return self.preloader.experts.object_of(src, selection)
        choice = choose(src.manifest, selection)
        if choice.whole:
            return src, None, None
        label = choice.label(src.version)
        of = {"version": src.version, "digest": src.manifest.digest, "kind": "partial",
              "selection": selection.to_dict()}
        pm = src.manifest.restrict(choice.paths, label=label, of=of)
        root = self.roots.dir(HOT) or self.roots.dir(WARM)
        obj = VersionDir(src.name, label, (root.path if root is not None else Path(".")) / src.name / label, pm)
        return obj, src, {**of, **choice.to_dict(), "label": label}

    def path(self, name: str, version: str | None = None, *, selection: Selection | None = None,
             companion: tuple[str, str] | None = None, suggest: bool = True) -> tuple[str, Path]:
        """The best complete local copy (hot before warm) of NAME@VERSION (latest published if None);
        with ``selection`` or ``companion``, of that object (never the version for a part of it, and
        never a part for the version). VERSION may be an object's own label (``V~p<hex>``).
        ``suggest=False``: a copy not here is a plain "not on this node", without reading cold storage
        (whether it is published, what was meant: :meth:`Catalog.not_found`)."""
        if version is None or selection is not None or companion is not None:
            src = self.resolve(name, version)
            version = src.version if selection is None and companion is None \
                else self.object_of(src, selection, companion)[0].version
        validate_label(version)
        for tier in LOCAL_TIERS:
            root = self.roots.dir(tier)
            v = read_version(root, name, version)
            if v is None or root is None or not self.reconciler.known_good(tier, root, v):
                continue
            if not self.trust.servable(root, v):  # signatures required: only a checked copy is served
                log.warning("not serving %s from %s: its signature was never checked here", v.ref, tier)
                continue
            self.state.touch(tier, name, version)
            return tier, v.path
        if not suggest:
            raise CheckpointNotFound(f"{name}@{version}", "not on this node")
        raise self.catalog.not_found(name, version)

    def status(self) -> dict[str, Any]:
        """What is where; reads only (nothing is created, locked or removed in any tier)."""
        return status(self.roots, self.state)

    def storage_problems(self) -> list[dict[str, str]]:
        """Configured storage that is not there as configured (cold absent or unmounted, a tier's parent
        missing); reads only. May block as long as the storage does: the daemon asks in a thread."""
        return storage_problems(self.roots)

    def pin(self, name: str, version: str | None) -> tuple[str, bool]:
        version = version or self.resolve(name, None).version
        validate_name(name)
        validate_label(version)
        return version, self.state.pin(name, version)

    def unpin(self, name: str, version: str | None) -> tuple[str, bool]:
        version = version or self.resolve(name, None).version
        validate_label(version)
        return version, self.state.unpin(name, version)

    def evict(self, name: str, version: str | None, tier: str | None = None, *, force: bool = False) -> list[str]:
        """Remove NAME@VERSION (every local version of NAME if VERSION is None) from a tier or all."""
        validate_name(name)
        if version is not None:
            validate_label(version)
        try:
            return self.space.evict(name, version, tier, force=force)
        except CheckpointNotFound:   # (nothing to evict: say whether it is published, or what was meant)
            raise self.catalog.not_found(name, version, tier=tier) from None

    def gc(self) -> dict[str, Any]:
        """Reconcile, expire leases, and bring every tier above its high watermark down to the low one.
        ``refused``: what was left alone because weightd cannot prove it made it (one line each)."""
        reconciled = self.reconcile()
        refused: list[str] = []
        return {"reconcile": reconciled, "evicted": self.space.to_low_watermarks(refused), "refused": refused}

    # -- what is where (for the control plane: through the checked roots, never by path) -------------
    def resolve(self, name: str, version: str | None) -> VersionDir:
        """The manifest of NAME@VERSION (latest published when VERSION is None): cold first, else local.
        A version that is in cold storage with a damaged manifest is a ManifestError (exit 2)."""
        return self.catalog.resolve(name, version)

    def published_versions(self, name: str) -> list[VersionDir]:
        return self.catalog.published_versions(name)

    def not_found(self, name: str, version: str | None = None, *, tier: str | None = None) -> CheckpointNotFound:
        """The not-found error every command that takes NAME[@VERSION] gives (:meth:`Catalog.not_found`)."""
        return self.catalog.not_found(name, version, tier=tier)

    def wait_published(self, name: str, version: str | None, deadline: float | None,
                       poll_s: float = 1.0, cancel: Any = None) -> VersionDir:
        """Resolve, waiting for the version to be published (until ``deadline``, then TimedOut; until
        ``cancel``, a threading.Event, is set)."""
        return self.catalog.wait_published(name, version, deadline, poll_s, cancel)

    def tier_used(self, tier: str, *, exclude: str | None = None) -> int:
        """Bytes of complete versions plus the expected size of every staging area in the tier but
        ``exclude`` (a retry's own staging area never counts against it)."""
        return self.space.tier_used(tier, exclude=exclude)

    def tier_dir(self, tier: str) -> Dir | None:
        """The tier's root, opened by descriptor and checked (None if it does not exist yet)."""
        return self.catalog.tier_dir(tier)

    def versions(self, tier: str) -> list[VersionDir]:
        """Every complete version in a local tier."""
        return self.catalog.versions(tier)

    def version(self, tier: str, name: str, version: str) -> VersionDir | None:
        """NAME@VERSION in ``tier`` (``cold`` included), or None."""
        return self.catalog.version(tier, name, version)

    def listing(self, name: str | None = None) -> list[dict[str, Any]]:
        """Published versions (of NAME) and where each is local; local versions not in cold too."""
        return self.catalog.listing(name)

    def add_lease(self, tier: str, name: str, version: str, seconds: float, holder: str | None = None) -> float:
        """Lease a local copy for ``seconds`` more (a caller that shared another's transfer); returns
        when it ends. The copy must be there (CheckpointNotFound otherwise)."""
        validate_name(name)
        validate_label(version)
        if read_version(self.roots.dir(tier), name, version) is None:
            raise CheckpointNotFound(f"{name}@{version}", f"not in the {tier} tier")
        self.state.add_lease(tier, name, version, seconds, holder)
        return self.now() + seconds

    def hold(self, tier: str, name: str, version: str, seconds: float, holder: str) -> bool:
        """Renew ``holder``'s one lease on a local copy for ``seconds`` (False: the copy is not there)."""
        validate_name(name)
        validate_label(version)
        if read_version(self.roots.dir(tier), name, version) is None:
            return False
        self.state.hold(tier, name, version, seconds, holder)
        return True

    def check_cold_readable(self, limit: int = 50) -> dict[str, Any]:
        """Whether this process can read cold storage: up to ``limit`` versions, every file opened."""
        return self.catalog.check_readable(limit)

    def published(self) -> list[VersionDir]:
        """Every version published in cold storage."""
        return self.catalog.versions(COLD)

    def published_version(self, name: str, version: str) -> VersionDir | None:
        return self.catalog.version(COLD, name, version)

