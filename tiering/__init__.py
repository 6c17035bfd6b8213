"""weightd's local data plane: manifests, hashing, checkpoints on disk.

Knows nothing of the network or of the daemon (never imports ``p2p`` or ``weightd``).
"""

from .build import Problem, VerifyReport, build_manifest, verify_checkpoint
from .diff import ManifestDiff, TensorChange, diff_manifests
from .errors import (BadInput, CheckpointNotFound, ChecksumMismatch, FileChanged, IntegrityError,
                     InvalidName, ManifestError, SafetensorsHeaderError, TieringError, UnsafePath)
from .manifest import (FORMAT, MANIFEST_RELPATH, FileEntry, Manifest, Part, SafetensorsInfo, TensorEntry,
                       load_manifest, manifest_from_dict, write_manifest)
from .names import parse_ref, validate_name, validate_relpath, validate_version
from .safetensors_header import SafetensorsHeader, TensorInfo, read_header
from .scan import ScannedFile, scan_checkpoint
from .units import format_bytes, parse_fraction, parse_size

__all__ = [
    "BadInput", "CheckpointNotFound", "ChecksumMismatch", "FileChanged", "FileEntry", "FORMAT",
    "IntegrityError", "InvalidName", "MANIFEST_RELPATH", "Manifest", "ManifestDiff", "ManifestError",
    "Part", "Problem", "SafetensorsHeader", "SafetensorsHeaderError", "SafetensorsInfo", "ScannedFile",
    "TensorChange", "TensorEntry", "TensorInfo", "TieringError", "UnsafePath", "VerifyReport",
    "build_manifest", "diff_manifests", "format_bytes", "load_manifest", "manifest_from_dict",
    "parse_fraction", "parse_ref", "parse_size", "read_header", "scan_checkpoint", "validate_name",
    "validate_relpath", "validate_version", "verify_checkpoint", "write_manifest",
]
