"""The docs' shape: every page opens with what a user does (a command or a short example) and keeps figures for
later; every registry kind is named wherever the kinds are listed; excerpts of files are those files verbatim;
every relative link and anchor leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from waypost.kind_table import all_kinds

ROOT = Path(__file__).resolve().parents[2]
#: every page of the docs, the site's subfolders (how-to/, reference/) included
PAGES = sorted((ROOT / "docs").rglob("*.md"))
#: the first code block of a page starts within this many lines of its title
OPENING_LINES = 15
#: at most this many words of prose come before it
OPENING_WORDS = 90
FENCE = re.compile(r"^```")


def _opening(page: Path) -> tuple[list[str], int | None]:
    """The page's lines, and the index of its first code fence when it comes before the first ``##``."""
    lines = page.read_text().splitlines()
    assert lines and lines[0].startswith("# "), f"{page.name}: the first line is not a '# ' title"
    for i, line in enumerate(lines[1:], 1):
        if line.startswith("## "):
            return lines, None
        if FENCE.match(line):
            return lines, i
    return lines, None


def _prose(lines: list[str]) -> str:
    return " ".join(line for line in lines if not line.startswith("<!--"))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT / "docs")) for p in PAGES])
def test_every_page_opens_with_what_a_user_does(page: Path):
    lines, fence = _opening(page)
    assert fence is not None, f"{page.name}: no command or example before its first '##' section"
    assert fence <= OPENING_LINES, f"{page.name}: its first command or example is on line {fence + 1}"
    words = len(_prose(lines[1:fence]).split())
    assert words <= OPENING_WORDS, f"{page.name}: {words} words before its first command or example"
    # figures come after what to do: no measurement in the words before it
    assert not re.search(r"\bmeasured\b|\d\s*(ms|us|µs)\b", _prose(lines[1:fence]), re.IGNORECASE), page.name


def _kinds(pred) -> set[str]:
    return {k.scheme for k in all_kinds().values() if pred(k)}


def _line(path: str, starts: str) -> str:
    found = [line for line in (ROOT / path).read_text().splitlines() if line.startswith(starts)]
    assert len(found) == 1, (path, starts, len(found))
    return found[0]


def _paragraph(path: str, contains: str) -> str:
    found = [p for p in (ROOT / path).read_text().split("\n\n") if contains in p]
    assert len(found) == 1, (path, contains, len(found))
    return found[0]


def test_every_kind_is_listed_where_the_kinds_are_listed():
    every = _kinds(lambda k: True)
    assert "eureka" in every
    table = _paragraph("docs/registry-kinds.md", "| scheme | what |")
    assert {s for s in every if f"| `{s}`" not in table} == set()
    targets = _paragraph("docs/discovery.md", "| target | what it resolves |")
    assert {s for s in every if f"`{s}:" not in targets} == set()
    # the kinds a server registers in beside the keyed ones (etcd, and memory for tests): the README's opening line
    # and its registries bullet
    titles = {k.title for k in all_kinds().values() if (k.registrar is not None and not k.keyed) or k.scheme == "k8s"}
    intro = _paragraph("README.md", "Service registration, discovery and client-side load balancing")
    assert {t for t in titles if t not in intro} == set(), intro
    bullet = _paragraph("README.md", "- registries beyond etcd:")
    assert {s for s in _kinds(lambda k: k.registrar is not None and not k.keyed) if f"`{s}://" not in bullet} == set(), bullet
    # the registries the console lists and `waypost drain` writes to
    console_kinds = _kinds(lambda k: k.keyed or k.console_source is not None)
    row = _line("docs/cli.md", "| `--registry URL` |")
    assert {s for s in console_kinds if f"`{s}://" not in row} == set(), row
    line = _paragraph("docs/cli.md", "One page, updated live over server-sent events")
    assert {s for s in _kinds(lambda k: k.console_source is not None) if f"`{s}://`" not in line} == set(), line
    sources = _paragraph("docs/console.md", "`sources` has one entry per registry")
    assert {s for s in console_kinds if f"`{s}`" not in sources} == set(), sources


EXCERPT = re.compile(r"^<!-- excerpt: (\S+) -->\n```[\w-]*\n(.*?)\n```", re.DOTALL | re.MULTILINE)


def test_excerpts_are_their_files_verbatim():
    """A block marked ``<!-- excerpt: PATH -->`` shows part of PATH as it is (the development Eureka's files)."""
    found = 0
    for page in [ROOT / "README.md", *PAGES]:
        for m in EXCERPT.finditer(page.read_text()):
            found += 1
            source = ROOT / m.group(1)
            assert source.is_file(), f"{page.name}: excerpt of a missing file {m.group(1)}"
            assert m.group(2) in source.read_text(), f"{page.name}: the excerpt of {m.group(1)} is not in it"
    assert found >= 3


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    out: set[str] = set()
    in_code = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return out


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_and_anchors_lead_somewhere():
    broken = []
    for page in [ROOT / "README.md", *PAGES, ROOT / "examples" / "README.md"]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
