"""The node's operations, once: ``publish``, ``preload``, ``path``, ``status``, ``pin``, ``unpin``,
``evict`` and ``gc``. The daemon's handlers and the in-process CLI both call a :class:`NodeService`,
so both validate alike (refs, tier names, lease and timeout bounds: :mod:`.requests`), make the
torrent at publish, count the same metrics (:mod:`.outcomes`) and log the same lines. What only a
daemon has (single flight, thread pools, a P2P session that seeds, SO_PEERCRED checks) stays in the
daemon, around the service.

The service is synchronous and blocking (copies, hashing); the daemon runs it in its pools.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tiering import DEFAULT_LEASE_S, run_bounded, HOT, LOCAL_TIERS, SignatureRefused, validate_name, validate_version

from ..errors import InvalidRequest
from .outcomes import Outcomes
from .ready_estimate import guarded, unknown_listing
from .requests import DEFAULT, PreloadRequest, check_companion, check_seconds, check_tier, split_ref

if TYPE_CHECKING:
    from tiering import LocalNode

    from ..config import Config
    from ..metrics import Metrics

log = logging.getLogger(__name__)

ProgressFn = Callable[[int], None]
PublishedHook = Callable[[str, str, "Path | None"], None]



class NodeService:
    """The operations on one :class:`tiering.LocalNode`, with its metrics.

    ``on_published(name, version, torrent)``: called after a publish (the daemon seeds from it)."""

    def __init__(self, config: "Config", node: "LocalNode", metrics: "Metrics", *,
                 on_published: PublishedHook | None = None, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config, self.node, self.metrics = config, node, metrics
        self.on_published = on_published
        self.on_loaded: Callable[[str, str, str], None] | None = None   # (name, version, tier) after a preload
        self.monotonic = monotonic
        self.outcomes = Outcomes(metrics)
        from .ready_estimate import ReadyEstimator
        self.estimates = ReadyEstimator(config, self.outcomes.rates)   # how soon each known version is ready
        if hasattr(type(metrics), "watch_ready_estimates"):             # (a Tally has no such gauge)
            metrics.watch_ready_estimates(lambda: self.estimates.current(self.node.status))

    # -- publish ------------------------------------------------------------------------------------
    def publish(self, src: Path, name: str, version: str, *, progress: ProgressFn | None = None,
                sign_key: Path | None = None, signature: Path | None = None, check: Any = None,
                default_key: bool = True) -> dict[str, Any]:
        """``sign_key`` (else ``[publish] signing_key``, unless ``default_key`` is False) signs the version; ``signature`` attaches a
        model-signing bundle made elsewhere (checked to cover exactly these bytes); ``check(path, st)``
        is asked of every inode the scan pins (the daemon: could the caller read it?)."""
        from .swarm import ensure_torrent
        validate_name(name)
        validate_version(version)
        if sign_key is not None and signature is not None:
            raise InvalidRequest("sign_key", "give a key to sign with or a signature made elsewhere, not both")
        key = sign_key if sign_key is not None or signature is not None or not default_key \
            else self.config.settings.publish.signing_key
        bundle = None
        if signature is not None:
            try:
                bundle = Path(signature).read_bytes()
            except OSError as exc:
                raise InvalidRequest("signature", f"cannot read {signature}: {exc.strerror}") from None
        try:
            r = self.node.publish(Path(src), name, version, progress=progress, sign_key=key, signature=bundle,
                                  check=check)
        except SignatureRefused as exc:
            self.metrics.trust_refusals.labels(exc.reason).inc()
            raise
        # (an object-store cold tier has no torrent yet: its versions move from cold, not over P2P)
        torrent = None if self.node.roots.object is not None else ensure_torrent(self.config, self.node.resolve(name, version))
        log.info("published name=%s version=%s bytes=%d unchanged=%s torrent=%s", name, version, r.bytes,
                 r.unchanged, bool(torrent))
        if self.on_published is not None:
            self.on_published(name, version, torrent)
        return {**r.to_dict(), "torrent": str(torrent) if torrent else None}

    # -- preload: validate, resolve, load ----------------------------------------------------------
    def preload_request(self, ref: str, *, tier: Any = HOT, strict: bool = False, lease_s: Any = DEFAULT,
                        timeout_s: Any = None, wait: bool = False, holder: str | None = None,
                        selection: Any = None, whole: Any = False, companion: Any = None,
                        warm_for: tuple[int, ...] = ()) -> PreloadRequest:
        """Validated alike for the CLI and the daemon (InvalidRequest naming the key, exit 2).
        ``selection``: ``{include, exclude, layers, tp_rank}`` (a partial copy); without one, the
        model's configured default patterns apply unless ``whole``. ``companion``: ``{kind, key}``."""
        name, version = split_ref(ref)
        tier = check_tier(tier)
        lease = DEFAULT_LEASE_S if lease_s is DEFAULT else check_seconds("lease_s", lease_s)
        timeout = None if timeout_s is None else check_seconds("timeout_s", timeout_s)
        return PreloadRequest(name, version, tier, bool(strict), lease, timeout, bool(wait), holder,
                              self.selection_for(name, selection, whole), check_companion(companion), warm_for)

    def selection_for(self, name: str, selection: Any = None, whole: Any = False) -> Any:
        """The files a request for NAME means: its own selection over the model's configured default
        patterns (``[models."NAME"]``), none of them with ``whole``."""
        from tiering import BadInput, selection_from_dict
        if not isinstance(whole, bool):
            raise InvalidRequest("whole", "'whole' must be true or false")
        try:
            sel = selection_from_dict(selection)
        except BadInput as exc:
            raise InvalidRequest("selection", str(exc)) from None
        if whole:
            if not sel.whole:
                raise InvalidRequest("whole", "give file patterns, layers or a rank, or ask for every file, not both")
            return None
        sel = sel.merged_with(self.config.settings.default_selection(name))
        return None if sel.whole else sel

    def needs_resolving(self, req: PreloadRequest) -> bool:
        return req.version is None or req.wait

    def resolve(self, req: PreloadRequest, cancel: Any = None, *, bound_s: float | None = None) -> PreloadRequest:
        """The request with its version resolved (waiting for publication if it asks to; ``cancel``, a
        threading.Event, ends the wait when its caller went away). ``bound_s``: without a timeout_s, the
        longest a resolve (not a wait for publication) may read cold storage (the daemon's bound)."""
        t0 = self.monotonic()
        deadline = None if req.timeout_s is None else t0 + req.timeout_s
        if deadline is None and bound_s is not None and not req.wait:
            deadline = t0 + bound_s
        what = f"resolving {req.ref}"
        if not req.wait:  # (a manifest read from a hung cold server must not outlive --timeout either)
            v = run_bounded(lambda: self.node.resolve(req.name, req.version), deadline=deadline, what=what,
                            clock=self.monotonic)
            return replace(req, version=v.version)
        v = run_bounded(lambda: self.node.wait_published(req.name, req.version, deadline, cancel=cancel),
                        deadline=deadline,
                        what=what, clock=self.monotonic)
        left = None if req.timeout_s is None else max(0.001, req.timeout_s - (self.monotonic() - t0))
        return replace(req, version=v.version, wait=False, timeout_s=left)  # one deadline for wait and load

    def resolved(self, req: PreloadRequest) -> PreloadRequest:
        """The request with its version resolved (cold first, else local), unbounded: the daemon bounds it."""
        return replace(req, version=self.node.resolve(req.name, req.version).version)

    def published(self, req: PreloadRequest) -> PreloadRequest | None:
        """One poll of a wait for publication: the request resolved, or None (not published yet). Never
        lists cold storage for a suggestion (a poll a second)."""
        from tiering import CheckpointNotFound
        try:
            v = self.node.catalog.resolve(req.name, req.version, suggest=False)
        except CheckpointNotFound:
            return None
        return replace(req, version=v.version, wait=False)

    def not_found(self, ref: str) -> Exception:
        """The error for NAME@VERSION not on this node, with whether it is published or what was meant
        (reads cold storage)."""
        name, version = split_ref(ref, local=True)
        return self.node.catalog.not_found(name, version)

    def local_size(self, req: PreloadRequest) -> int | None:
        """The bytes of a resolved request's copy when it is on this node already (the state database's
        record; no read of cold storage), else None. Only for the version itself (a part or a
        companion has a label of its own: :meth:`placed_size`)."""
        if req.selection is not None or req.companion is not None or req.version is None:
            return None
        for tier in (req.tier, *(t for t in LOCAL_TIERS if t != req.tier)):
            row = self.node.state.copy(tier, req.name, req.version)
            if row is not None:
                return row.bytes
        return None

    def placed_size(self, req: PreloadRequest) -> int:
        """The bytes a resolved request places: the object it names (the version, its selection's files
        or its companion), from a local copy's manifest when there is one, else cold storage's."""
        assert req.version is not None
        src = None
        for tier in LOCAL_TIERS:
            src = self.node.version(tier, req.name, req.version)
            if src is not None:
                break
        if src is None:
            src = self.node.resolve(req.name, req.version)
        return self.node.object_of(src, req.selection, req.companion)[0].size

    def size(self, req: PreloadRequest) -> int:
        """Bytes to expect (for a progress bar); 0 if not known yet."""
        try:
            return self.node.resolve(req.name, req.version).size
        except FileNotFoundError:
            return 0

    def load(self, req: PreloadRequest, *, progress: ProgressFn | None = None) -> dict[str, Any]:
        """Run a resolved preload, counted in the metrics whatever its outcome."""
        m = self.metrics
        m.in_flight.labels("local").inc()
        t0 = self.monotonic()
        try:
            r = self.node.preload(req.name, req.version, tier=req.tier, strict=req.strict, lease_s=req.lease_s,
                                  timeout_s=req.timeout_s, progress=progress, holder=req.holder,
                                  selection=req.selection, companion=req.companion, warm_for=req.warm_for)
        except BaseException as exc:
            reason = self.outcomes.failed(req, exc)
            if isinstance(exc, Exception):
                log.info("preload failed name=%s version=%s tier=%s reason=%s: %s", req.name, req.version, req.tier,
                         reason, exc)
            raise
        finally:
            m.in_flight.labels("local").dec()
        d = r.to_dict()
        self.outcomes.succeeded(r, d, self.monotonic() - t0)
        if self.on_loaded is not None:
            self.on_loaded(req.name, r.version, r.tier)
        by = d["bytes_by_source"]
        log.info("preloaded name=%s version=%s tier=%s bytes=%d bytes_moved=%d cold=%d origin=%d peer=%d "
                 "local_reuse=%d already_present=%s seconds=%.3f", req.name, r.version, r.tier, d["bytes"],
                 r.bytes_moved, by.get("cold", 0), by.get("origin", 0), by.get("peer", 0), by.get("local_reuse", 0),
                 str(bool(d.get("already_present"))).lower(), d["seconds"])
        return d

    def preload(self, ref: str, *, progress: ProgressFn | None = None, waited_on: bool = True,
                **kw: Any) -> dict[str, Any]:
        """``waited_on``: a caller waits for it (counted in time to ready), not background work."""
        t0 = self.monotonic()
        req = self.preload_request(ref, **kw)
        if req.wait:
            req = self.resolve(req)
        report = self.load(req, progress=progress)
        if waited_on:
            self.ready(req.name, report, self.monotonic() - t0)
        return report

    def ready(self, name: str, report: dict[str, Any], seconds: float) -> None:
        """One request answered with its copy verified, placed and warm, ``seconds`` after it arrived
        (waiting for publication, for a shared transfer and for warming included)."""
        self.outcomes.ready(name, report["tier"], seconds)

    def preload_set(self, refs: Any, *, threads: int | None = None, **kw: Any) -> dict[str, Any]:
        """Every model of a set (LoRA adapters) as one operation: each its own preload, ``threads`` at
        once (default: one per core, 2 to 8), one summary (``weightd.node.sets.summarize``); a failure of one
        does not stop the others."""
        import os
        from concurrent.futures import ThreadPoolExecutor
        threads = threads or min(8, max(2, os.cpu_count() or 2))
        from .sets import check_refs, summarize
        refs = check_refs(refs)
        reqs = [self.preload_request(r, **kw) for r in refs]   # every one checked before anything moves
        t0 = self.monotonic()

        def one(req: PreloadRequest) -> Any:
            try:
                return self.load(self.resolve(req) if self.needs_resolving(req) else req)
            except Exception as exc:  # (reported in the summary, with its exit code)
                return exc
        with ThreadPoolExecutor(max(1, min(threads, len(reqs))), "weightd-set") as pool:
            outcomes = list(pool.map(one, reqs))
        r = summarize(refs, outcomes, self.monotonic() - t0, reqs[0].tier)
        log.info("preloaded a set models=%d ready=%d failed=%d bytes=%d seconds=%.3f", r["models"], r["ready"],
                 len(r["failed"]), r["bytes"], r["seconds"])
        return r

    # -- queries and admin --------------------------------------------------------------------------
    def path_needs_cold(self, ref: str, *, selection: Any = None, whole: Any = False, companion: Any = None) -> bool:
        """Whether :meth:`path` must ask cold storage (which version is the latest, or which object a
        selection or companion is); NAME@VERSION itself is answered from the local tiers alone."""
        name, version = split_ref(ref, local=True)
        sel, comp = self.selection_for(name, selection, whole), check_companion(companion)
        if version is not None and "~" in version:
            sel = comp = None
        return version is None or sel is not None or comp is not None

    def path(self, ref: str, *, selection: Any = None, whole: Any = False, companion: Any = None,
             suggest: bool = True) -> dict[str, Any]:
        """The best local copy of what a preload of the same arguments made (a partial copy when
        NAME has default patterns; the whole version only with ``whole``, and only when complete)."""
        name, version = split_ref(ref, local=True)
        sel, comp = self.selection_for(name, selection, whole), check_companion(companion)
        if version is not None and "~" in version and (sel is not None or comp is not None):
            sel = comp = None   # (an object named by its own label is that object)
        tier, p = self.node.path(name, version, selection=sel, companion=comp, suggest=suggest)
        return {"tier": tier, "path": str(p)}

    def publish_companion(self, src: Path, ref: str, kind: str, key: str, *, progress: ProgressFn | None = None,
                          check: Any = None, sign_key: Path | None = None) -> dict[str, Any]:
        """Publish a directory (a compile cache, ...) as NAME@VERSION's companion of ``kind`` for ``key``,
        signed with ``sign_key`` (else ``[publish] signing_key``) when there is one."""
        name, version = split_ref(ref)
        key_file = sign_key if sign_key is not None else self.config.settings.publish.signing_key
        if version is None:
            raise InvalidRequest("companion_of", f"--companion-of {ref}: name the version (NAME@VERSION)")
        comp = check_companion({"kind": kind, "key": key})
        assert comp is not None
        try:
            r = self.node.publish_companion(Path(src), name, version, *comp, progress=progress, check=check,
                                            sign_key=key_file)
        except SignatureRefused as exc:
            self.metrics.trust_refusals.labels(exc.reason).inc()
            raise
        log.info("published companion name=%s version=%s kind=%s key=%s bytes=%d unchanged=%s", name, version,
                 kind, key, r.bytes, r.unchanged)
        return {**r.to_dict(), "torrent": None, "companion_of": f"{name}@{version}", "kind": kind, "key": key}

    def status(self, problems: list[dict[str, str]] | None = None) -> dict[str, Any]:
        """``problems``: the storage problems the caller already knows (the daemon's storage check);
        None: look now."""
        st = self.node.status()
        return {**st, "transfers": [], "answered_by": "in-process",
                "problems": self.node.storage_problems() if problems is None else problems,
                "time_to_ready": self.outcomes.ready_times.summary(),
                "ready_estimates": guarded("status", lambda: self.estimates.from_status(st), []),
                "recent_events": self.outcomes.recent()}

    def join_lease(self, req: PreloadRequest, report: dict[str, Any]) -> dict[str, Any]:
        """A caller that shared another caller's transfer gets its own lease, as its own holder (the
        transfer's lease was the first caller's, for the first caller's time)."""
        if req.lease_s > 0:
            until = self.node.add_lease(report["tier"], req.name, report["version"], req.lease_s, req.holder)
            report = {**report, "lease_expires_at": until}
        return report

    def hold(self, ref: str, tier: Any, lease_s: Any, holder: str) -> dict[str, Any]:
        """Renew ``holder``'s one lease on NAME@VERSION's copy in ``tier`` for ``lease_s`` more seconds
        (``weightd hold``, every few seconds while it runs); ``lease_s`` 0 releases it. ``held`` is
        False when the copy is not there (evicted, deleted): the holder preloads it again."""
        name, version = split_ref(ref)
        if version is None:
            raise InvalidRequest("ref", f"hold {name}: name the version (NAME@VERSION)")
        tier = check_tier(tier)
        seconds = check_seconds("lease_s", lease_s)
        v = self.node.version(tier, name, version)
        held = v is not None and self.node.hold(tier, name, version, seconds, holder)
        out: dict[str, Any] = {"name": name, "version": version, "tier": tier, "held": held and seconds > 0}
        if v is not None and seconds > 0:
            out.update(path=str(v.path), lease_expires_at=time.time() + seconds)
        if seconds == 0 or not held:
            log.info("hold %s name=%s version=%s tier=%s holder=%s", "released" if seconds == 0 else "found no copy",
                     name, version, tier, holder)
        return out

    def check_cold(self) -> dict[str, Any]:
        """Can this process (the daemon's user) read cold storage? ``weightd doctor`` asks."""
        return self.node.check_cold_readable()

    def versions(self, name: str | None = None) -> dict[str, Any]:
        """``weightd ls``: published versions and where each is local; a NAME with none, published or
        here, is not found (exit 3, with what was probably meant), as for every command that takes one."""
        rows = self.node.listing(name)
        if name is not None and not rows:
            raise self.node.not_found(name)
        st = self.node.status() if any(r["local"] for r in rows) else {}   # (residency of the local copies)
        return {"versions": guarded("ls", lambda: self.estimates.for_listing(rows, st), unknown_listing(rows))}

    def pin(self, ref: str) -> dict[str, Any]:
        return self._pin(ref, True)

    def unpin(self, ref: str) -> dict[str, Any]:
        return self._pin(ref, False)

    def _pin(self, ref: str, pin: bool) -> dict[str, Any]:
        name, version = split_ref(ref, local=True)
        if pin and version is not None:
            if "~" in version:  # a partial copy or companion: pinned only when it is here (or published)
                if not self._exists(name, version):
                    raise self.node.not_found(name, version)
            else:
                self.node.resolve(name, version)  # pin only what exists (published or here): CheckpointNotFound
        version, changed = (self.node.pin if pin else self.node.unpin)(name, version)
        if not pin and not changed and not self._exists(name, version):
            # (a pin of what no longer exists is still lifted above; a typo is not "was not pinned", exit 0)
            raise self.node.not_found(name, version)
        log.info("%s name=%s version=%s changed=%s", "pin" if pin else "unpin", name, version, changed)
        return {"name": name, "version": version, "changed": changed}

    def _exists(self, name: str, version: str) -> bool:
        """NAME@VERSION is published or held in a local tier."""
        return any(self.node.version(t, name, version) is not None for t in (*LOCAL_TIERS, "cold"))

    def evict(self, ref: str, tier: Any = None, force: bool = False, all_versions: bool = False) -> dict[str, Any]:
        name, version = split_ref(ref, local=True)
        if version is None and not all_versions:  # (a slip of the keyboard must not empty a node of a model)
            raise InvalidRequest("ref", f"evict {name}: name a version ({name}@VERSION), or pass --all to evict "
                                 f"every local version of {name}")
        out = self.node.evict(name, version, check_tier(tier, optional=True), force=bool(force))
        log.info("evict name=%s version=%s evicted=%s", name, version, ",".join(out) or "-")
        return {"evicted": out}

    def gc(self) -> dict[str, Any]:
        """The node's gc (tiers, leases, staging), then the downloads Hub imports left behind."""
        from .import_gc import sweep_imports
        report = self.node.gc()
        removed, refused = sweep_imports(Path(self.config.settings.state_dir) / "imports" / "hf")
        report["imports"] = {"removed": removed, "refused": refused}
        if report["evicted"]:
            log.info("gc evicted %s", ", ".join(report["evicted"]))
        return report