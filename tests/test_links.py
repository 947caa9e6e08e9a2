"""Every relative link in the notebooks, the README and docs/ resolves to a file of the repository,
and every ``#anchor`` of a link into a markdown page to a heading of that page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target), ![alt](target)
CODE_PATH = r"`(\.\.?/[^`\s]+)`"  # a relative path in inline code
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)  # a fenced code block: its "# ..." lines are no headings


def documents() -> list[tuple[Path, str]]:
    """(file, markdown text) of every README, docs page and notebook markdown cell."""
    found = [
        (p, p.read_text()) for p in [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("tests/fixtures/*.md")]
    ]
    for nb_path in sorted(REPO.glob("notebooks/*.ipynb")):
        cells = json.loads(nb_path.read_text())["cells"]  # (plain JSON: the device machine has no nbformat)
        found.append((nb_path, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")))
    return found


def relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]  # no URL, no anchor


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, links reduced to their text, punctuation but
    ``-`` and ``_`` dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a markdown page: one per heading outside code blocks (a repeated heading's
    second gets ``-1``, as on GitHub), and every ``id="..."`` or ``name="..."`` of its HTML."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", text), re.M):
        s = slug(m.group(1))
        found.add(f"{s}-{seen[s]}" if s in seen else s)
        seen[s] = seen.get(s, 0) + 1
    return found | set(re.findall(r"""\b(?:id|name)=["']([^"']+)["']""", text))


def anchored_links(path: Path, text: str) -> list[tuple[str, Path, str]]:
    """(link, markdown page, anchor) of every link with an ``#anchor`` into a markdown page: the page
    itself for ``#anchor``, else the ``.md`` file the link names."""
    found = []
    for target in LINK.findall(text):
        page, _, anchor = target.partition("#")
        if not anchor or re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        if not page and path.suffix == ".md":
            found.append((target, path, anchor))
        elif page.endswith(".md"):
            found.append((target, (path.parent / page).resolve(), anchor))
    return found


def test_the_link_pattern_finds_links_and_skips_urls():
    text = 'see [a](../docs/a.md#x), ![i](img.svg "title"), [u](https://x.org/y), [h](#anchor), [m](mailto:a@b)'
    assert relative_links(text) == ["../docs/a.md#x", "img.svg"]


def test_anchors_are_githubs_and_code_blocks_hold_none():
    text = "# The `.pte` file, (read)\n## Notes\n## Notes\n```python\n# not a heading\n```\n<a id='here'></a>\n"
    assert anchors(text) == {"the-pte-file-read", "notes", "notes-1", "here"}
    assert slug("ExecuTorch `.pte` and torch `.pt2` programs") == "executorch-pte-and-torch-pt2-programs"
    page = REPO / "docs" / "x.md"
    links = anchored_links(page, "[a](#one) [b](other.md#two) [c](nb.ipynb#three) [d](https://x.org/#four)")
    assert links == [("#one", page, "one"), ("other.md#two", (page.parent / "other.md").resolve(), "two")]


@pytest.mark.parametrize("path, text", documents(), ids=lambda v: v.name if isinstance(v, Path) else "")
def test_every_relative_link_resolves(path, text):
    broken = [t for t in relative_links(text) if not (path.parent / t.split("#")[0]).exists()]
    assert not broken, f"{path.relative_to(REPO)}: links to missing files: {broken}"
    missing = [
        link
        for link, page, anchor in anchored_links(path, text)
        if page.is_file() and anchor not in anchors(page.read_text(encoding="utf-8"))
    ]
    assert not missing, f"{path.relative_to(REPO)}: links to headings its target does not have: {missing}"


def test_the_docs_the_code_and_the_pages_name_are_in_the_repository():
    """docs/upstream.md, docs/background.md and the picture are named by code, tests/fixtures/README.md
    and notebooks; every ``docs/<file>`` a page or notebook names, as a link or not, is a file."""
    for name in ("upstream.md", "background.md", "shared_cache.svg"):
        assert (REPO / "docs" / name).is_file(), name
    for path, text in documents():
        missing = [n for n in re.findall(r"(?<![\w/.])docs/[\w.-]+\.\w+", text) if not (REPO / n).is_file()]
        assert not missing, f"{path.relative_to(REPO)} names files the repository does not hold: {missing}"


def test_a_path_a_page_names_in_code_exists():
    """A page points the reader only at what a checkout holds: a relative path written as code
    (`` `../seeds/x.txt` ``) is checked as a link is."""
    assert re.findall(CODE_PATH, "read `../seeds/x.txt` and `./a.md`, not `a/b` or `..`") == [
        "../seeds/x.txt",
        "./a.md",
    ]
    for path, text in documents():
        missing = [name for name in re.findall(CODE_PATH, text) if not (path.parent / name).exists()]
        assert not missing, f"{path.relative_to(REPO)} names files a checkout does not hold: {missing}"
