"""The tensors of one safetensors file in a manifest, held as columns (issue 40).

A mixture-of-experts checkpoint lists ~90,000 tensors; as one frozen object per tensor (a name, a
dtype, a shape tuple, two offsets and a hex digest) that was ~450 bytes each, 40 MB of Python objects
for every copy a process held. :class:`TensorTable` keeps the same facts as columns: every name in one
string with their end offsets, dtypes as one byte each, shapes flattened, offsets in ``array('q')``,
digests as 16 raw bytes each: ~100 bytes a tensor. It is a read-only ``Sequence[TensorEntry]``: an
entry is made when it is asked for (``table[i]``, iteration) and not kept, so code that reads tensors
one by one is unchanged; bulk readers use the column accessors (:meth:`hex_digests`, :meth:`spans`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from collections.abc import Sequence
from itertools import accumulate, chain, repeat
from typing import Iterable, Iterator, overload

from json.encoder import encode_basestring as _js  # (a str as json.dumps(..., ensure_ascii=False) writes it)
from json.encoder import ESCAPE as _ESCAPED  # (what _js escapes)

from .safetensors_header import DTYPE_BITS

DTYPES: tuple[str, ...] = tuple(sorted(DTYPE_BITS))  # (plain ASCII names: written into JSON as they are)
_DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}
_PLAIN = bytes(c for c in range(0x20, 0x7f) if c not in b'"\\')  # (ASCII that _js writes as it is)


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute offsets in the file
    end: int
    xxh3_128: str

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class TensorTable(Sequence):  # Sequence[TensorEntry]
    __slots__ = ("_names", "_name_ends", "_dtypes", "_dims", "_dim_ends", "_begins", "_ends", "_digests",
                 "__weakref__")

    def __init__(self, names: Sequence[str], dtypes: Sequence[str], shapes: Iterable[Iterable[int]], begins: Iterable[int],
                 ends: Iterable[int], digests: bytes) -> None:
        """Columns already checked by the caller (a manifest reader or builder): ``digests`` holds 16
        bytes per tensor. A dtype outside :data:`DTYPES` is a KeyError, a negative or oversized integer
        an OverflowError."""
        shapes = list(shapes)
        self._names = "".join(names)
        # (an array fills faster from a list than from an iterator)
        self._name_ends = array("q", list(accumulate(map(len, names))))
        self._dtypes = bytes(map(_DTYPE_CODE.__getitem__, dtypes))
        self._dims = array("q", list(chain.from_iterable(shapes)))
        self._dim_ends = array("q", list(accumulate(map(len, shapes))))
        self._begins, self._ends = array("q", begins), array("q", ends)
        self._digests = bytes(digests)
        n = len(self._name_ends)
        if not (len(self._dtypes) == len(self._dim_ends) == len(self._begins) == len(self._ends) == n
                and len(self._digests) == 16 * n):
            raise ValueError("tensor columns of different lengths")

    @classmethod
    def of(cls, entries: Iterable[TensorEntry]) -> "TensorTable":
        """A table of TensorEntry objects (the manifest builder's, or a test's)."""
        if isinstance(entries, TensorTable):
            return entries
        es = list(entries)
        return cls([e.name for e in es], [e.dtype for e in es], [e.shape for e in es],
                   [e.begin for e in es], [e.end for e in es],
                   bytes.fromhex("".join(e.xxh3_128 for e in es)))

    def __len__(self) -> int:
        return len(self._begins)

    def _entry(self, i: int) -> TensorEntry:
        a = self._name_ends[i - 1] if i else 0
        c = self._dim_ends[i - 1] if i else 0
        return TensorEntry(self._names[a:self._name_ends[i]], DTYPES[self._dtypes[i]],
                             tuple(self._dims[c:self._dim_ends[i]]), self._begins[i], self._ends[i],
                             self._digests[16 * i:16 * i + 16].hex())

    @overload
    def __getitem__(self, i: int) -> TensorEntry: ...
    @overload
    def __getitem__(self, i: slice) -> tuple: ...

    def __getitem__(self, i: "int | slice") -> TensorEntry:
        if isinstance(i, slice):
            return tuple(self._entry(j) for j in range(*i.indices(len(self))))
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("tensor index out of range")
        return self._entry(i)

    def __iter__(self) -> Iterator[TensorEntry]:
        return (self._entry(i) for i in range(len(self)))

    def names(self) -> list[str]:
        s, ends = self._names, self._name_ends
        return [s[a:b] for a, b in zip((0, *ends[:-1]), ends)] if ends else []

    def hex_digests(self) -> list[str]:
        d = self._digests
        return [d[i:i + 16].hex() for i in range(0, len(d), 16)]

    @property
    def digest_bytes(self) -> bytes:
        """Every tensor's xxh3-128, 16 raw bytes each, in file order (what a file's tree hash is taken over)."""
        return self._digests

    def spans(self) -> list[tuple[int, int]]:
        return list(zip(self._begins, self._ends))

    def json_text(self, *, canonical: bool) -> str:
        """The tensors as a manifest writes them: canonical (sorted keys, no spaces, joined by ``,``: the
        bytes the digest is taken over) or readable (``", "`` and ``": "``, fields in the manifest's
        order, one line each indented by three spaces, joined by ``",\n"``; :meth:`Manifest.to_json`).
        The same text ``json.dumps(..., ensure_ascii=False)`` writes for each tensor's dict
        (tests/test_manifest_compact.py holds them equal)."""
        return self.json_texts()[0 if canonical else 1]

    def json_texts(self) -> tuple[str, str]:
        """:meth:`json_text` canonical and readable, from one pass over the columns (a build renders
        both: :meth:`built` gives them with the table)."""
        if not len(self):
            return "", ""
        names = list(map(self._names.__getitem__, map(slice, chain((0,), self._name_ends), self._name_ends)))
        dims = list(map(str, self._dims))
        shapes = list(map(",".join, map(dims.__getitem__, map(slice, chain((0,), self._dim_ends), self._dim_ends))))
        return self._render(names, list(map(DTYPES.__getitem__, self._dtypes)), shapes)

    @classmethod
    def built(cls, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[tuple[int, ...]],
              begins: Sequence[int], ends: Sequence[int], digests: bytes) -> "tuple[TensorTable, str, str]":
        """A table of these columns (as :meth:`__init__`) and its :meth:`json_texts`, rendered from the
        columns as given (no name or shape taken back out of the table: the manifest builder's way)."""
        table = cls(names, dtypes, shapes, begins, ends, digests)
        if not len(table):
            return table, "", ""
        # (a header's shapes are a few tuples, each shared by its tensors: each written once)
        text_of = {k: ",".join(map(str, sh)) for k, sh in dict(zip(map(id, shapes), shapes)).items()}
        return (table, *table._render(list(names), list(dtypes), list(map(text_of.__getitem__, map(id, shapes)))))

    def _render(self, names: list[str], dtypes: list[str], shapes: list[str]) -> tuple[str, str]:
        """Both renderings of this (non-empty) table, given its names, dtypes and shapes (``"8,8"``) as
        lists: each other column's text made once with C loops (``map``) and interleaved with the fixed
        text by one ``str.join`` per rendering (no dict, encoder or format call per tensor: issue 40)."""
        every = self._names
        # (ASCII with nothing _js escapes: deleting every plain byte leaves none, 3x the speed of a search)
        if every.isascii() and not every.encode("ascii").translate(None, _PLAIN) or not _ESCAPED.search(every):
            q = '"'  # (nothing to escape: each name is written as it is, between the quotes given here)
        else:
            q, names = "", list(map(_js, names))
        spaced = {t: t.replace(",", ", ") for t in set(shapes)}
        digests = self._digests.hex(",", 16).split(",")
        begins = list(map(str, self._begins))
        ends = begins[1:] + [str(self._ends[-1])] if self._begins[1:] == self._ends[:-1] else list(map(str, self._ends))
        canonical = "".join(chain.from_iterable(zip(
            repeat(',{"begin":'), begins, repeat(',"dtype":"'), dtypes, repeat('","end":'), ends,
            repeat(f',"name":{q}'), names, repeat(f'{q},"shape":['), shapes, repeat('],"xxh3_128":"'), digests,
            repeat('"}'))))[1:]
        readable = "".join(chain.from_iterable(zip(
            repeat(f'\n   {{"name": {q}'), names, repeat(f'{q}, "dtype": "'), dtypes, repeat('", "shape": ['),
            map(spaced.__getitem__, shapes), repeat('], "begin": '), begins, repeat(', "end": '), ends,
            repeat(', "xxh3_128": "'), digests, repeat('"},'))))[1:-1]
        return canonical, readable

    def columns(self) -> list[bytes]:
        """The table as eight byte strings (names as UTF-8, the rest as stored), for
        :meth:`from_columns` in another process (the manifest parse cache)."""
        return [self._names.encode(), self._name_ends.tobytes(), self._dtypes, self._dims.tobytes(),
                self._dim_ends.tobytes(), self._begins.tobytes(), self._ends.tobytes(), self._digests]

    @classmethod
    def from_columns(cls, cols: list[bytes]) -> "TensorTable":
        """The table :meth:`columns` gave; ValueError when they do not fit together (a damaged cache)."""
        if len(cols) != 8:
            raise ValueError("expected 8 tensor columns")
        t = cls.__new__(cls)
        t._names = cols[0].decode()
        t._name_ends, t._dims, t._dim_ends, t._begins, t._ends = (array("q", cols[i]) for i in (1, 3, 4, 5, 6))
        t._dtypes, t._digests = bytes(cols[2]), bytes(cols[7])
        n = len(t._name_ends)
        if not (len(t._dtypes) == len(t._dim_ends) == len(t._begins) == len(t._ends) == n
                and len(t._digests) == 16 * n and (not n or t._name_ends[-1] == len(t._names))
                and (not n or t._dim_ends[-1] == len(t._dims)) and max(t._dtypes, default=0) < len(DTYPES)):
            raise ValueError("tensor columns that do not fit together")
        return t

    def _key(self) -> tuple:
        return (self._names, self._name_ends, self._dtypes, self._dims, self._dim_ends, self._begins, self._ends,
                self._digests)

    def __eq__(self, other: object) -> bool:
        return self._key() == other._key() if isinstance(other, TensorTable) else NotImplemented

    def __hash__(self) -> int:
        return hash((self._names, self._digests, self._begins.tobytes()))

    def __repr__(self) -> str:
        return f"TensorTable({len(self)} tensors)"


