"""Delta updates: build a new version from bytes already on the node, fetch only what changed.

A plan is made from manifests alone. Every file of the new version is cut into its manifest parts
(the safetensors header, each tensor, 16 MiB chunks of other files); a part whose content (xxh3-128
and length) is a part of any complete local version, of this checkpoint or any other, is taken from
that *donor*, at whatever offset and in whatever file it sits there. So tensors that moved within a
file, renamed or re-sharded files and tensors shared across checkpoints are reused; everything else
is fetched. Parts are the unit because the manifest already hashes them: a donor range is checked
against the very hash that chose it, and nothing else needs to be stored.

Non-safetensors files use the manifest's fixed 16 MiB chunks rather than content-defined chunks: in
a checkpoint they are configs, tokenizers and vocabularies (kilobytes to a few MB) that are either
identical (reused whole) or small enough to fetch whole; content-defined chunking would need a
second, rolling-hash index in every manifest to save a few MB.

Building from a plan never trusts a donor: ``build_verified`` reads every part once, from its donor or
the source, hashes it from the buffer it writes it from and checks it against the manifest there; a
donor part that fails (a donor rotted on disk) or a donor that vanished is read from the source
instead, and nothing is read back.

:mod:`.plan` makes the plan, :mod:`.verified` builds from it checking every part, :mod:`.build` copies donor parts without checking them
(a P2P prefill, whose pieces libtorrent checks).
"""

from __future__ import annotations

from .build import BuildResult, prefill
from .plan import DeltaPlan, Donor, FilePlan, Span, plan_delta
from .verified import build_verified

__all__ = ["BuildResult", "DeltaPlan", "Donor", "FilePlan", "Span", "build_verified", "plan_delta",
           "prefill"]
