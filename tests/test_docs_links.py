"""Links between the docs resolve: every relative Markdown link names a file that exists,
and every `#anchor` (in a link, or in a `docs/x.md#anchor` reference from a code comment)
names a heading of that file, as GitHub makes anchors from headings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [
    p
    for folder in ("src", "bench", "scripts", "tests")
    for p in sorted((ROOT / folder).rglob("*"))
    if p.suffix in (".py", ".pxd", ".sh", ".md") or p.name == "compare"
]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# `docs/benchmarks.md#s3` in a comment or docstring
REFERENCE = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    found: set[str] = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def test_slug_follows_github() -> None:
    assert slug("Busy waiting: S3 with `--busy-wait-us`") == "busy-waiting-s3-with---busy-wait-us"
    assert slug("Python clients: leveret.client, aio-pika, pika") == (
        "python-clients-leveretclient-aio-pika-pika"
    )
    assert slug("Where S3's time goes") == "where-s3s-time-goes"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_links_resolve(doc: Path) -> None:
    broken = []
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_anchor_references_in_code_resolve() -> None:
    docs = {p.name: p for p in DOCS}
    broken = []
    for source in SOURCES:
        for name, anchor in REFERENCE.findall(source.read_text(encoding="utf-8")):
            if name in docs and anchor not in anchors(docs[name]):
                broken.append(f"{source.relative_to(ROOT)}: {name}#{anchor}")
    assert not broken, "\n".join(broken)
