"""The documentation's shape: README.md stays the project's front door, and no relative link in it or in docs/ breaks.

Checks, without a model or the network:

- README.md has at most 300 lines (the detail lives in docs/*.md);
- every relative Markdown link or image, `[text](target)` or `[label]: target`, in README.md and docs/*.md names a
  file or folder that exists relative to the linking file (http(s)://, mailto: and other schemes are not checked);
- where a link names an anchor (`page.md#anchor`, or `#anchor` in the same file), a heading of that Markdown file
  has that anchor by GitHub's rules (lowercased; punctuation but hyphens and underscores dropped; spaces to hyphens;
  `-1`, `-2`, ... for repeats). Links inside code (fenced blocks, `inline code`) are not links and are skipped.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 300
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks (a fence's own lines included as blanks)."""
    lines, fence = [], ""
    for line in text.splitlines():
        match = _FENCE.match(line)
        if fence:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = ""
            lines.append("")
        elif match:
            fence = match.group(1)
            lines.append("")
        else:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: links become their text, then lowercase, punctuation but `-` and `_`
    dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor a Markdown file has: its headings' slugs (repeats numbered as GitHub does) and HTML anchors."""
    text = path.read_text(encoding="utf-8")
    found: set[str] = set(_HTML_ANCHOR.findall(text))
    counts: dict[str, int] = {}
    for line in _prose_lines(text):
        match = _HEADING.match(line)
        if match:
            base = slug(match.group(1))
            count = counts.get(base, 0)
            counts[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def link_targets(text: str) -> list[str]:
    """The targets of a Markdown text's inline links, images and reference definitions, outside code."""
    prose = _CODE_SPAN.sub(lambda match: "x" * len(match.group(0)), "\n".join(_prose_lines(text)))
    targets = [*_INLINE_LINK.findall(prose), *_REFERENCE.findall(prose)]
    return [target[1:-1] if target.startswith("<") else target for target in targets]


def _shown(path: Path) -> str:
    """A path as a message names it: relative to the repository where it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def broken_links(page: Path) -> list[str]:
    """What is wrong with each relative link of a Markdown file, one line each (none: every link resolves)."""
    problems = []
    for target in link_targets(page.read_text(encoding="utf-8")):
        if _SCHEME.match(target) or target.startswith("//"):
            continue  # http(s)://, mailto: and the like: not a file of this repository
        file_part, _, anchor = target.partition("#")
        file_part = file_part.split("?", 1)[0]
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            problems.append(f"{target}: {file_part} does not exist")
        elif anchor and linked.suffix == ".md" and linked.is_file() and anchor.lower() not in anchors(linked):
            problems.append(f"{target}: no heading of {_shown(linked)} has the anchor #{anchor}")
    return problems


def test_readme_is_at_most_300_lines():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: move detail into a page under docs/")


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in link_targets(README.read_text())}
    assert [page.name for page in PAGES[1:] if page.resolve() not in linked] == []


def test_slugs_follow_githubs_rules():
    assert slug("`specdec serve --engine vllm`") == "specdec-serve---engine-vllm"
    assert slug("The file's own bits") == "the-files-own-bits"
    assert slug("Fields refused when set (400 naming the field)") == "fields-refused-when-set-400-naming-the-field"
    assert slug("Weights, dtypes and model families") == "weights-dtypes-and-model-families"
    assert slug("snake_case and [a link](x.md)") == "snake_case-and-a-link"


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n\n## A section\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md) [fine](other.md#a-section) [repeat](other.md#a-section-1) [here](#page) "
        "[web](https://example.com/x.md) [mail](mailto:a@b.c) ![img](other.md)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [bad here](#nowhere)\n"
        "`[in code](missing-in-code.md)`\n\n```\n[in a block](missing-in-block.md)\n```\n\n"
        "[ref]: also-missing.md\n",
        encoding="utf-8")
    assert broken_links(page) == [
        "missing.md: missing.md does not exist",
        "other.md#nowhere: no heading of other.md has the anchor #nowhere",
        "#nowhere: no heading of page.md has the anchor #nowhere",
        "also-missing.md: also-missing.md does not exist",
    ]
