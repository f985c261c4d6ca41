"""The README and the CLI agree: every `triton-sam ...` command it shows names real subcommands and
options, and every benchmark it says can run alone is a `python -m benchmarks` choice."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from benchmarks.__main__ import build_parser as benchmarks_parser
from triton_sam.cli import build_parser

README = (Path(__file__).parents[1] / "README.md").read_text()


def _documented_commands() -> list[str]:
    spans = re.findall(r"`(triton-sam [^`]*)`", README)
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return spans + [line for line in lines if line.startswith("triton-sam ")]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _check(command: str) -> None:
    parser = build_parser()
    for token in shlex.split(command)[1:]:
        subcommands = _subcommands(parser)
        if token in subcommands:
            parser = subcommands[token]
        elif token.startswith("--"):
            option = token.split("=")[0]
            assert option in parser._option_string_actions, f"{command!r}: {parser.prog} has no option {option}"
        else:
            placeholder = token.isupper() or "..." in token or token in ("|", "&&")
            assert not subcommands or placeholder, f"{command!r}: {parser.prog} has no command {token!r}"
            if token == "&&":
                break


def test_every_documented_command_and_option_exists():
    commands = _documented_commands()
    assert len(commands) > 20  # the README shows many; a broken pattern would find none
    for command in commands:
        _check(command)


def test_every_benchmark_the_readme_says_runs_alone_is_a_bench_command():
    paragraph = README[README.index("Each runs in its own process") :].split("\n\n")[0]
    kinds = re.findall(r"`(\w+)`\s+\(", paragraph)
    assert {"predictor", "click", "annotators", "memory", "gui"} <= set(kinds)
    assert set(kinds) <= set(_subcommands(benchmarks_parser()))
