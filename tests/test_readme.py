"""The README, the pages of docs/ and the code agree: every `triton-sam ...` command they show names
real subcommands and options (and values among an option's choices), every `python -m benchmarks
...` command a real benchmark and its options, every relative link a file that exists (and a
heading there, for a link to one), and every benchmark is described where the development page
says they each run alone."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from benchmarks.__main__ import build_parser as benchmarks_parser
from triton_sam.cli import build_parser

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "BENCHMARKS.md"]  # the last: generated
PROGRAMS = {"triton-sam": (1, build_parser), "python -m benchmarks": (3, benchmarks_parser)}


def _shown_commands(text: str, program: str) -> list[str]:
    """The commands for `program` in `text`: inline code spans and lines of bash blocks."""
    spans = re.findall(rf"`({re.escape(program)}(?:\s[^`]*)?)`", text)
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return spans + [line for line in lines if line == program or line.startswith(program + " ")]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _placeholder(token: str) -> bool:
    return token.isupper() or "..." in token or token == "|"


def _check(command: str, program: str) -> None:
    skip, make_parser = PROGRAMS[program]
    parser, option = make_parser(), None
    for token in shlex.split(command)[skip:]:
        subcommands = _subcommands(parser)
        if token in subcommands:
            parser, option = subcommands[token], None
        elif token.startswith("--"):
            name = token.split("=")[0]
            assert name in parser._option_string_actions, f"{command!r}: {parser.prog} has no option {name}"
            option = parser._option_string_actions[name]
        else:
            assert not subcommands or _placeholder(token), f"{command!r}: {parser.prog} has no command {token!r}"
            if option is not None and option.choices is not None and not _placeholder(token):
                assert token in option.choices, f"{command!r}: {token!r} is not a choice of {option.option_strings[0]}"


def test_the_pages_checked_are_the_readme_and_the_docs():
    names = {page.name for page in PAGES}
    assert {"README.md", "napari.md", "python-api.md", "serving.md", "development.md"} <= names


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_every_command_shown_names_real_subcommands_and_options(program):
    shown = {page.name: _shown_commands(page.read_text(), program) for page in PAGES}
    assert sum(map(len, shown.values())) > (20 if program == "triton-sam" else 8)  # a broken pattern finds none
    for commands in shown.values():
        for command in commands:
            for part in (part.strip() for part in command.split("&&")):  # each command of a chain
                if part.startswith(program):
                    _check(part, program)


@pytest.mark.parametrize(
    ("program", "command"),
    [
        ("triton-sam", "triton-sam bench all"),
        ("triton-sam", "triton-sam serve --no-such-option"),
        ("triton-sam", "triton-sam model"),
        ("triton-sam", "triton-sam export MODEL --random-init && triton-sam modles"),
        ("python -m benchmarks", "python -m benchmarks all --profile tiny"),
        ("python -m benchmarks", "python -m benchmarks hover --backends remote"),
    ],
)
def test_the_command_check_catches_what_is_not_there(program, command):
    with pytest.raises(AssertionError):
        for part in command.split(" && "):
            _check(part, program)


def test_benchmarks_md_shows_the_command_that_made_it():
    benchmarks = (ROOT / "BENCHMARKS.md").read_text()
    assert "This page is generated from the results files by `python -m benchmarks report docs/benchmarks/cpu/" in benchmarks


def _links(page: Path) -> list[str]:
    return [link for link in re.findall(r"\]\(([^)\s]+)\)", page.read_text()) if not re.match(r"[a-z]+:", link)]


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_points_to_a_file_that_exists():
    links = {page: _links(page) for page in PAGES}
    assert sum(map(len, links.values())) > 20
    for page, targets in links.items():
        for target in targets:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name}: link to {target}, which does not exist"
            if anchor and file.suffix == ".md":
                assert anchor in _anchors(file), f"{page.name}: link to {target}, a heading {file.name} does not have"


def test_every_benchmark_is_described_where_the_development_page_says_they_each_run_alone():
    text = (ROOT / "docs" / "development.md").read_text()
    paragraph = text[text.index("Each runs in its own process") :].split("\n\n")[0]
    kinds = set(re.findall(r"`(\w+)`\s+\(", paragraph))
    assert kinds == set(_subcommands(benchmarks_parser())) - {"all", "report"}


def test_the_readme_lists_every_command_of_the_cli():
    readme = (ROOT / "README.md").read_text()
    listed = readme[readme.index("`triton-sam --help` lists the commands:") :].split("\n\n")[0]
    assert set(re.findall(r"`([a-z-]+)`", listed)) == set(_subcommands(build_parser()))
