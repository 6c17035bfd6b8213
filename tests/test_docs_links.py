"""The README and the pages of docs/ hold together: every relative link names a file that exists, every
``#anchor`` names a heading of the page it points into (by GitHub's slug rules), and the README stays
a short front page (under 320 lines) whose details live in docs/."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE = re.compile(r"(`+)(.+?)\1")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, _CODE.sub("", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lower case, punctuation other than '-' and
    '_' removed, each space a '-' (github-slugger)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # a link: its text
    text = _CODE.sub(lambda m: m.group(2), text)                    # inline code: its content
    text = re.sub(r"<[^>]+>", "", text)                             # inline HTML
    text = re.sub(r"(\*\*|__|\*)", "", text)                        # emphasis markers
    text = text.strip().lower()
    kept = []
    for ch in text:
        if ch in "-_ " or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            kept.append("-" if ch == " " else ch)
    return "".join(kept)


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of a Markdown file (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, line in _prose_lines(path.read_text()) for m in _LINK.finditer(line)]


def test_slug_follows_githubs_rules() -> None:
    assert slug("P2P (checkpoints at or above `[p2p] threshold`, default 10 GiB)") == \
        "p2p-checkpoints-at-or-above-p2p-threshold-default-10-gib"
    assert slug("Private fleets: TLS between peers and to the tracker") == \
        "private-fleets-tls-between-peers-and-to-the-tracker"
    assert slug("Object storage as the cold tier (`s3://`)") == "object-storage-as-the-cold-tier-s3"
    assert slug("Upgrades, rollbacks and versions that may be mixed") == \
        "upgrades-rollbacks-and-versions-that-may-be-mixed"
    assert slug("`weightd doctor --json` (schema `weightd.doctor/v1`)") == "weightd-doctor---json-schema-weightddoctorv1"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n## A section\n\n[ok](#a-section) [bad](#nowhere) `[code](#x)`\n\n"
                    "```\n[fenced](#y)\n```\n")
    found = links(page)
    assert [t for _, t in found] == ["#a-section", "#nowhere"]
    assert anchors(page) == {"title", "a-section"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    bad = []
    for n, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):   # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            bad.append(f"{page.name}:{n}: {target}: no such file")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{page.name}:{n}: {target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_the_readme_is_a_short_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 320
    # the set-up commands CI and the tools that read the README rely on
    assert "make demo" in readme and "make test" in readme
    # every page of docs/ is reachable from it
    linked = {t.partition("#")[0] for _, t in links(ROOT / "README.md")}
    missing = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"
