"""The project is self-contained: no file points outside the repository for what it relies on.

What the code relies on (hook points, xnu semantics, the capture protocol, report formats) is
written in docs/, indexed by docs/README.md.  These checks keep it so: no file of the project names
a document outside the repository, every ``docs/domain/<file>.md, "Section"`` reference in the tree
names a file and a heading that exist, relative links between Markdown files resolve (anchors
included), and the docs index mentions every document.

Binary files are not searched: captures record the module paths of the machine they were made on,
which is data, not a reference.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Written in pieces so that this file does not contain the very strings it forbids.
OUTSIDE = {
    "the domain document": re.compile(r"\bDOMAIN" + r"\.md\b|\bDOMAIN\s*§"),
    "a sibling shared folder": re.compile(re.escape("..") + r"/shared\b"),
    "the machine's work folder": re.compile(r"(?<![\w.-])/" + r"work/"),
    "a seeds folder": re.compile(r"(?<![\w-])seeds" + r"/"),
}
DOMAIN_REF = re.compile(r"docs/domain/([A-Za-z0-9_-]+\.md)(?:,\s*\"([^\"\n]+)\")?")
MD_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def project_files() -> list[Path]:
    """Tracked files plus new ones not ignored, so a file is checked before its first commit."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git work tree ({e})")
    paths = sorted({ROOT / p for p in out.decode().split("\0") if p})
    return [p for p in paths if p.is_file()]


def text_of(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def text_files() -> list[tuple[Path, str]]:
    return [(p, t) for p in project_files() if (t := text_of(p)) is not None]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)]


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def test_the_patterns_find_what_they_are_meant_to_find() -> None:
    doc = "DOMAIN" + ".md"
    must_match = {
        "the domain document": [f"see {doc} §4", "(DOMAIN" + " §5)"],
        "a sibling shared folder": [".." + "/shared/x.md"],
        "the machine's work folder": ["/" + "work/main/build/demo/x", "cat /" + "work/x"],
        "a seeds folder": ["seeds" + "/000.txt", ".." + "/shared/" + "seeds" + "/README.md"],
    }
    must_not_match = ["docs/domain/malloc.md", "the domain digest", "network/", "https://a.org/work/",
                      "random seed", "seeds are drawn", "shared/memory"]
    for name, samples in must_match.items():
        for s in samples:
            assert OUTSIDE[name].search(s), (name, s)
    for s in must_not_match:
        assert not any(p.search(s) for p in OUTSIDE.values()), s


def test_no_file_points_outside_the_repository() -> None:
    files = text_files()
    assert any(p.name == "README.md" and p.parent == ROOT for p, _ in files)   # the list is real
    hits = []
    for path, text in files:
        for n, line in enumerate(text.splitlines(), 1):
            for name, pattern in OUTSIDE.items():
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {name}: {line.strip()[:100]}")
    assert not hits, "files point outside the repository (write it in docs/ instead):\n" + "\n".join(hits)


def test_domain_references_name_a_file_and_a_section_that_exist() -> None:
    checked = 0
    bad = []
    for path, text in text_files():
        for n, line in enumerate(text.splitlines(), 1):
            for m in DOMAIN_REF.finditer(line):
                checked += 1
                target = ROOT / "docs" / "domain" / m.group(1)
                where = f"{path.relative_to(ROOT)}:{n}"
                if not target.is_file():
                    bad.append(f"{where}: no {target.relative_to(ROOT)}")
                elif m.group(2) and not any(m.group(2).lower() in h.lower() for h in headings(target)):
                    bad.append(f"{where}: no heading containing {m.group(2)!r} in {m.group(1)}")
    assert checked >= 5, f"only {checked} docs/domain references found: the pattern no longer matches them"
    assert not bad, "\n".join(bad)


def test_relative_markdown_links_resolve() -> None:
    checked = 0
    bad = []
    for path, text in text_files():
        if path.suffix != ".md":
            continue
        for m in MD_LINK.finditer(FENCE.sub("", text)):
            link = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", link):          # http:, https:, mailto:
                continue
            file_part, _, anchor = link.partition("#")
            target = (path.parent / file_part).resolve() if file_part else path
            checked += 1
            where = f"{path.relative_to(ROOT)}: ({link})"
            if not target.exists():
                bad.append(f"{where}: no such file")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                bad.append(f"{where}: no heading with anchor #{anchor}")
    assert checked >= 10, f"only {checked} relative links found"
    assert not bad, "\n".join(bad)


def test_docs_index_mentions_every_document() -> None:
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    docs_dir = ROOT / "docs"
    docs = [p.relative_to(docs_dir).as_posix() for p in project_files()
            if p.suffix == ".md" and docs_dir in p.parents and p != docs_dir / "README.md"]
    missing = [d for d in docs if not re.search(r"(?<![\w/.-])" + re.escape(d), index)]
    assert len(docs) >= 9, docs
    assert not missing, f"docs/README.md does not mention: {', '.join(missing)}"
