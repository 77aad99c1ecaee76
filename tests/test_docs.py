"""The docs hold together: a short README, links that resolve, every page in the nav,
and a CLI reference that shows every command and option of the click group."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import click
import markdown  # type: ignore[import-untyped]
import pytest
from markdown.extensions.toc import slugify  # type: ignore[import-untyped]

from replayer.cli import main

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted([REPO / "README.md", *DOCS.glob("**/*.md")])
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"<h([1-6])[^>]*>(.*?)</h\1>", flags=re.DOTALL)
# click's --help: an option's line starts with two spaces and its flags
# ("  -o, --out PATH", "  --loop / --no-loop"); wrapped help lines are indented further.
_OPTION_HEAD = re.compile(r"^  (-\S.*?)(?:\s{2,}|$)", flags=re.MULTILINE)


def _prose(path: Path) -> str:
    return _FENCE.sub("", path.read_text())


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", _prose(path), flags=re.MULTILINE)
    return {slugify(h, "-") for h in headings}


def test_readme_is_at_most_150_lines() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # an absolute URL (https:, mailto:)
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_docs_every_page_is_in_the_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    missing = [
        str(p.relative_to(DOCS))
        for p in DOCS.glob("**/*.md")
        if f": {p.relative_to(DOCS)}" not in nav
    ]
    assert not missing


def _commands(command: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, f"{path} {name}")


def test_docs_cli_reference_lists_every_command_and_option() -> None:
    # Rendered as mkdocs renders docs/cli.md: the mkdocs-click directive expands to
    # one heading per command (its full path, with attr_list) and its --help options.
    page = markdown.markdown(
        (DOCS / "cli.md").read_text(), extensions=["attr_list", "toc", "mkdocs-click"]
    )
    parts = _HEADING.split(page)
    # split() gives [before, level, title, body, level, title, body, ...]
    sections = {
        html.unescape(re.sub(r"<[^>]+>", "", title)).strip(): html.unescape(body)
        for title, body in zip(parts[2::3], parts[3::3], strict=True)
    }
    missing = []
    for path, command in _commands(main, "replayer"):
        if path not in sections:
            missing.append(path)
            continue
        shown = {
            flag
            for head in _OPTION_HEAD.findall(sections[path])
            for flag in re.findall(r"(?<![\w-])--?[\w-]+", head)
        }
        missing += [
            f"{path} {opt}"
            for param in command.params
            if isinstance(param, click.Option)
            for opt in (*param.opts, *param.secondary_opts)
            if opt not in shown
        ]
    assert not missing, f"not in the CLI reference: {missing}"
