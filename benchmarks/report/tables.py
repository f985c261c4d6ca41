"""The report's Markdown cells and tables: milliseconds, goal verdicts and pipe tables, alike in every section."""

from __future__ import annotations


def ms(value: float | None) -> str:
    """Milliseconds as a cell: whole from 100 up, else one decimal; "–" when not measured."""
    return "–" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def verdict(value: float | None, goal: float, higher_is_better: bool = False) -> str:
    """Whether `value` met `goal` (at most it, or at least it if `higher_is_better`), as the page says it."""
    if value is None:
        return "not measured"
    met = value >= goal if higher_is_better else value <= goal
    return "met" if met else "**missed**"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown pipe table of `rows` under `header`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"
