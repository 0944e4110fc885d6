"""Every relative Markdown link in README.md and docs/*.md names a file that exists, and where it names a
heading of a Markdown page (`page.md#heading`, or `#heading` on the same page), that heading exists: a page
moved or a heading renamed fails here rather than in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and [text](target "title"), not images' sources inside code; code spans and blocks are
# removed first, so a `[x](y)` written as code is not a link.
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    return _CODE.sub("", _FENCE.sub("", text))


def links(page: Path) -> list[str]:
    return _LINK.findall(prose(page.read_text()))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to
    hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(heading) for heading in _HEADING.findall(_FENCE.sub("", page.read_text()))}


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE))


def test_the_pages_have_links() -> None:
    assert sum(len(links(page)) for page in PAGES) > 20  # the pattern still finds them


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if is_external(target):
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(
                f"{target}: no {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}"
            )
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_the_anchor_rule_matches_github() -> None:
    assert anchor("Ownership traffic and failover (`bench/store_ops.py`)") == (
        "ownership-traffic-and-failover-benchstore_opspy"
    )
    assert anchor("Without keys: Microsoft Entra ID and Azure Workload Identity (recommended)") == (
        "without-keys-microsoft-entra-id-and-azure-workload-identity-recommended"
    )
