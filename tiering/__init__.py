"""weightd's local data plane: manifests, hashing, checkpoints on disk, tiers, page cache, deltas.

Knows nothing of the network or of the daemon (never imports ``p2p`` or ``weightd``). This module
is the package's public surface: the control plane and ``p2p`` import from here, never from the
modules behind it (``tests/test_layering.py`` checks it), so those can move without breaking them.
Names are resolved on first use (PEP 562), so ``from tiering import parse_size`` in a CLI command
that only needs a size parser does not pay for the tier code, the page-cache engine or xxhash.
"""

from __future__ import annotations

from ._lazy import surface

#: public name -> the module that defines it
_SURFACE: dict[str, str] = {
    # content: what a checkpoint is (tiering/content/)
    "FORMAT": "content.manifest", "MANIFEST_RELPATH": "content.manifest", "FileEntry": "content.manifest",
    "Manifest": "content.manifest", "Part": "content.manifest", "SafetensorsInfo": "content.manifest",
    "TensorEntry": "content.manifest", "load_manifest": "content.manifest_parse",
    "manifest_from_dict": "content.manifest_parse", "write_manifest": "content.manifest",
    "Problem": "content.build", "VerifyReport": "content.build", "build_manifest": "content.build",
    "verify_checkpoint": "content.build", "sample_verify": "content.build", "plan_size": "content.build",
    "ManifestDiff": "content.diff", "TensorChange": "content.diff", "diff_manifests": "content.diff",
    "SafetensorsHeader": "content.safetensors_header", "TensorInfo": "content.safetensors_header",
    "read_header": "content.safetensors_header",
    "ScannedFile": "content.scan", "scan_checkpoint": "content.scan", "scan_dir": "content.scan",
    "parse_ref": "content.names", "validate_name": "content.names", "validate_relpath": "content.names",
    "validate_version": "content.names", "validate_label": "content.names", "split_label": "content.names",
    "LABEL_SEP": "content.names",
    "Selection": "content.select", "Choice": "content.select", "choose": "content.select",
    "selection_from": "content.select", "selection_from_dict": "content.select",
    "MAX_SECONDS": "content.units", "piece_size_for": "content.units", "format_bytes": "content.units", "format_rate": "content.units", "format_duration": "content.units", "parse_fraction": "content.units", "parse_size": "content.units",
    "SignatureRefused": "content.signature", "SignedStatement": "content.signature",
    "TrustPolicy": "content.signature", "SIGNATURE_RELPATH": "content.signature", "HASHERS": "content.signature",
    "generate_keypair": "content.signature", "load_public_key": "content.signature",
    "read_unverified_signature": "content.signature",
    "make_checkpoint": "sample", "make_ranked_checkpoint": "sample", "mutate_tensor": "sample", "local_s3": "sample",
    "local_hub": "sample", "local_registry": "sample",
    # errors
    "BadInput": "errors", "Busy": "errors", "CheckpointNotFound": "errors", "ColdUnreadable": "errors",
    "ChecksumMismatch": "errors",
    "FileChanged": "errors", "IntegrityError": "errors", "InvalidName": "errors", "ManifestError": "errors",
    "NoSpace": "errors", "SafetensorsHeaderError": "errors", "TieringError": "errors", "TimedOut": "errors",
    "StorageUnavailable": "errors", "UnsafePath": "errors", "VersionConflict": "errors",
    # tiers on disk
    "COLD": "layout", "DIR_MODE": "layout", "HOT": "layout", "LOCAL_TIERS": "layout", "WARM": "layout",
    "TierSpec": "layout", "VersionDir": "layout", "existing_ancestor": "layout", "list_versions": "versions",
    "is_whole": "layout", "part_of": "layout",
    "Dir": "safefs", "check_unchangeable": "safefs", "open_cold_root": "safefs", "open_tier_root": "safefs",
    "open_unchangeable_dir": "safefs", "resolve_unchangeable": "safefs", "describe": "safefs",
    "open_cold_store": "safefs", "unmade_parent": "safefs", "RootPolicy": "safefs", "COLD_MARKER": "safefs",
    "StagingArea": "store.staging", "foreign_root": "store.roots",
    # the node (a facade over tiering/store/) and the seam to transfer sources
    "LocalNode": "node", "DEFAULT_LEASE_S": "node", "check_seconds": "node",
    "PreloadReport": "store.reports", "PublishReport": "store.reports",
    "FetchRequest": "sources.base", "FetchResult": "sources.base", "Fetcher": "sources.base",
    "SourceFallback": "sources.base",
    "parse_hub_ref": "sources.hf", "fetch_snapshot": "sources.hf", "discard_snapshot": "sources.hf",
    "resolve_commit": "sources.hf", "private_dir": "safefs.paths", "Cutoff": "http_cutoff",
    "Progress": "progress", "set_phase": "progress", "process_name": "inuse", "ObjectCold": "sources.s3.cold",
    "ObjectLocation": "sources.s3.client", "read_version": "versions",
    "OciCold": "sources.oci.cold", "RegistryLocation": "sources.oci.client", "ArtifactRef": "sources.oci.importer",
    "pull_artifact": "sources.oci.importer",
    # page cache (tiering/pagecache/)
    "collect_files": "pagecache.files",
    "cool": "pagecache.resident", "residency": "pagecache.resident",
    "WarmOptions": "pagecache.warming", "warm": "pagecache.warming",
    "LockedFiles": "pagecache.mlock", "check_memlock": "pagecache.mlock",
    # delta updates
    "run_bounded": "copy", "run_bounded_async": "copy", "bounded_running": "copy", "refuse_if_stuck": "copy", "stuck_reads": "copy", "ColdStorageStuck": "copy",
    "DeltaPlan": "delta.plan", "Donor": "delta.plan", "plan_delta": "delta.plan",
    "prefill_delta": "delta.build",
}
_RENAMED = {"prefill_delta": "prefill", "read_unverified_signature": "read_unverified"}

__getattr__, __dir__, __all__ = surface(__name__, _SURFACE, _RENAMED)
