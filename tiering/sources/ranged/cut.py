"""A file's parts still wanted, cut into the ranges a download asks for (:func:`groups`): along the
manifest's parts, so each part is hashed in order by one worker, in ranges of about equal size (no
small tail range: on a store that reads the whole object for every ranged GET, as moto does, a tail
costs as much as a full range)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...content.manifest import FileEntry

Span = tuple[Any, int, int]   # (a manifest part, the first and the last-plus-one byte of it in a range)


@dataclass
class Group:
    """One worker's share of a file: ranges fetched in order, and the hashes of their parts so far."""
    ranges: list[tuple[int, int, list[Span]]]   # (start, end, [(part, lo, hi)])
    hashers: dict[str, Any] = field(default_factory=dict)


def groups(f: FileEntry, chunk_size: int, range_bytes: int, have: set[str] | frozenset[str] = frozenset()
           ) -> list[Group]:
    """The file's parts still wanted (all but the labels in ``have``) as work: small consecutive parts
    packed into ranges of about equal size, none over ``range_bytes``; a part larger than that is one group of several ranges
    (fetched in order, so its hash is fed in order). Bytes no part covers (padding, a trailer) are
    fetched too, unhashed, as a verify ignores them."""
    parts = f.parts(chunk_size)
    out: list[Group] = []
    run: list[Any] = []   # consecutive parts still wanted, each no larger than a range

    def emit(cur: list[Any]) -> None:
        out.append(Group([(cur[0].begin, cur[-1].end, [(q, q.begin, q.end) for q in cur])]))

    def flush() -> None:
        """The run cut into as few ranges as fit ``range_bytes``, each ended at the part boundary nearest
        an equal share of what is left (about equal ranges: no small tail range)."""
        if not run:
            return
        last, cur = run[-1].end, []
        for q in run:
            if cur:
                begin = cur[0].begin
                share = begin + (last - begin) // -(-(last - begin) // range_bytes)
                if q.end - begin > range_bytes or (q.end > share and share - cur[-1].end < q.end - share):
                    emit(cur)
                    cur = []
            cur.append(q)
        emit(cur)
        run.clear()

    for p in parts:
        if p.label in have or p.length == 0:
            flush()
            continue
        if p.length > range_bytes:
            flush()
            out.append(Group([(s, min(p.end, s + range_bytes), [(p, s, min(p.end, s + range_bytes))])
                               for s in range(p.begin, p.end, range_bytes)]))
            continue
        if run and p.begin != run[-1].end:
            flush()
        run.append(p)
    flush()
    pos = 0
    for s, e in sorted((p.begin, p.end) for p in parts) + [(f.size, f.size)]:
        if s > pos:
            for g0 in range(pos, s, range_bytes):
                out.append(Group([(g0, min(s, g0 + range_bytes), [])]))
        pos = max(pos, e)
    return [g for g in out if any(e > s for s, e, _ in g.ranges)]
