"""Rendezvous (highest random weight) hashing, as the piece plan uses it: for every piece, its owner
among a list of labels (workers, or racks), with bounded loads; and a rack's gateway among its workers.

Every node that plans on the same list gets the same answer, and a label that comes or goes moves
(about) only its own pieces. Vectorised over pieces with numpy (splitmix64's finaliser as the mix).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

import numpy as np

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _key(label: str) -> np.uint64:
    return np.uint64(int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "little"))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised (uint64 arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _scores(pieces: np.ndarray, label: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _mix(pieces ^ _key(label))


def _piece_keys(idx: np.ndarray) -> np.ndarray:
    return _mix(idx.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15))


def rendezvous(num_pieces: int, labels: Sequence[str], slack: float | None = 0.1) -> np.ndarray:
    """For every piece, the index in ``labels`` of its owner: the label with the highest score (highest
    random weight hashing), the same answer on every node for the same labels, so a label that is
    missing or gone moves only (about) its own pieces.

    ``slack``: bounded loads (consistent hashing with bounded loads, Mirrokni et al.): no label owns
    more than about ``(1 + slack) * pieces / labels`` (at most 7% more, see ``step``; or one piece
    over the even share where that is more); a piece past
    that goes to its best label with room. Plain highest-score owners are uneven when each label has few pieces (4 workers and 90
    pieces gave slices of 17 to 28, and the swarm waits on the largest); the bound costs a few more
    pieces moved when a label comes or goes. ``None``: plain rendezvous."""
    k = len(labels)
    if not labels:
        return np.zeros(num_pieces, dtype=np.int32)
    pieces = _piece_keys(np.arange(num_pieces))
    best = np.zeros(num_pieces, dtype=np.uint64)
    owner = np.zeros(num_pieces, dtype=np.int32)
    for i, label in enumerate(labels):
        score = _scores(pieces, label)
        better = score > best
        best[better] = score[better]
        owner[better] = i
    if slack is None or k == 1:
        return owner
    # (integers: the same on every node; k rounded down to a step of k/16, so one label coming or
    # going mostly leaves the bound, and with it the others' slices, as it was: a bound that moved with
    # every k moved ~480 of 10,000 pieces when one of 1,000 labels left, instead of its own ~10)
    step = max(1, k // 16)
    cap = -(-num_pieces * (100 + round(slack * 100)) // (100 * (k - k % step)))
    # (and at least one piece over the even share: with a few pieces a label, a bound of the even
    # share alone fills every label, and one label gone cascades through all of them: up to 24% of
    # the pieces moved when one of 36 labels owning 2 of 63 left; with the one piece, at most 11%)
    cap = max(cap, -(-num_pieces // (k - k % step)) + 1)
    excluded: dict[int, set[int]] = {}   # piece -> labels it was turned away from
    for _ in range(64):   # (a few rounds in practice; any answer is a valid one, only less even)
        counts = np.bincount(owner, minlength=k)
        over = np.flatnonzero(counts > cap)
        if not len(over):
            break
        released = []
        for i in over:   # keep each full label's highest-scoring pieces (ties: lower piece first)
            theirs = np.flatnonzero(owner == i)
            order = np.lexsort((theirs, ~best[theirs]))
            for p in theirs[order[cap:]].tolist():
                excluded.setdefault(p, set()).add(int(i))
                released.append(p)
        counts = np.bincount(np.delete(owner, released), minlength=k)
        rel = np.array(sorted(released), dtype=np.int64)
        table = np.stack([_scores(pieces[rel], label) for label in labels], axis=1)   # (released, labels)
        for row, p in enumerate(rel.tolist()):
            table[row, list(excluded[p])] = 0
        table[:, counts >= cap] = 0
        pick = table.argmax(axis=1)
        stuck = table.max(axis=1) == 0   # (turned away everywhere with room: the emptiest label takes it)
        pick[stuck] = int(np.argmin(counts))
        owner[rel] = pick
        best[rel] = table[np.arange(len(rel)), pick]
    return owner


def gateway_of(rack: str, workers: Sequence[str]) -> str:
    """The gateway of ``rack`` among its ``workers`` (rendezvous hashing: every node that plans on the
    same list names the same one, and one leaving moves only its own role)."""
    return max(workers, key=lambda ip: (int(_key(f"gateway/{rack}/{ip}")), ip))


def gateways_of(rack: str, workers: Sequence[str], k: int = 1, skipped: Collection[str] = ()) -> list[str]:
    """The ``k`` gateways of ``rack`` among its ``workers``, best first, the first ``gateway_of``'s;
    among those not ``skipped`` (gateways their rack plans past), or all of them if none is left. The
    receivers (``gateways.py``) and the senders (``racks.py``) both ask this: they must agree."""
    workers = [ip for ip in workers if ip not in skipped] or list(workers)
    ranked = sorted(workers, key=lambda ip: (int(_key(f"gateway/{rack}/{ip}")), ip), reverse=True)
    return ranked[:max(1, k)]


def home_origins(workers: Collection[str], origins: Sequence[str]) -> dict[str, str]:
    """Each worker's home origin (``origins.py``): the workers in the order of their hash, each given
    its highest-scoring origin (rendezvous hashing) that has fewer than ``ceil(workers / origins)``;
    the same answer on every node for the same lists, and an origin that comes or goes moves (about)
    only its own workers and a few displaced ones."""
    cap = -(-len(workers) // max(1, len(origins)))
    load = dict.fromkeys(origins, 0)
    out: dict[str, str] = {}
    for w in sorted(workers, key=lambda w: (int(_key(f"worker/{w}")), w)):
        for o in sorted(origins, key=lambda o: (-int(_key(f"origin/{w}/{o}")), o)):
            if load[o] < cap:
                out[w], load[o] = o, load[o] + 1
                break
    return out
