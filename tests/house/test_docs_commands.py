"""The docs name only commands and flags that exist: every `rstar2 ...` a page of docs/ or the README writes (inline
or in a code block) resolves to a command of the real CLI, and each `--flag` after it is one of that command's
options. A renamed flag or a removed command then fails here, not in a reader's shell."""

from __future__ import annotations

import re

import click
import pytest

from rstar2_agent.cli import main

from conftest import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
SPAN = re.compile(r"`([^`\n]*\brstar2 [^`\n]*)`")


def snippets(text: str) -> list[str]:
    """Each command line the page shows: inline code spans, and the lines of fenced or indented code blocks."""
    out = [m.group(1) for m in SPAN.finditer(text)]
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if (fenced or line.startswith("    ")) and re.search(r"(^|[\s;&|(])rstar2 ", line) and "`" not in line:
            out.append(line.strip())
    return out


def resolve(words: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """The deepest command the words name, the path taken, and the words after it."""
    ctx = click.Context(main)
    command: click.Command = main
    path: list[str] = []
    rest = list(words)
    while rest and isinstance(command, click.Group):
        sub = command.get_command(ctx, rest[0])
        if sub is None and runs_by_default(command):  # `rstar2 eval aime24 ...` is `rstar2 eval run aime24 ...`
            sub, rest = command.commands["run"], ["run", *rest]
        if sub is None:
            break
        command, path = sub, [*path, rest.pop(0)]
    return command, path, rest


def runs_by_default(group: click.Group) -> bool:
    """A group that hands a word it does not know to its `run` command (its own parse_args says so)."""
    return "run" in group.commands and type(group).parse_args is not click.Group.parse_args


def options(command: click.Command) -> set[str]:
    names = {"--help"}
    for p in command.params:
        names |= {o for o in [*p.opts, *p.secondary_opts] if o.startswith("--")}
    return names


def problems(snippet: str) -> list[str]:
    out = []
    for part in re.split(r"[;&|]+|\$\(", snippet.split(" #")[0]):  # a shell comment is prose
        m = re.search(r"(?:^|\s)rstar2 (.*)", part)
        if not m:
            continue
        words = [w.strip("\"'),.:") for w in m.group(1).split()]
        words = [w for w in words if w]
        if not words or words[0] in ("...", "…") or not re.fullmatch(r"[a-z][a-z0-9-]*", words[0]):
            continue
        command, path, rest = resolve(words)
        if isinstance(command, click.Group) and rest and re.fullmatch(r"[a-z][a-z0-9-]+", rest[0]) \
                and not rest[0].startswith("-"):
            out.append(f"`{' '.join(['rstar2', *path, rest[0]])}`: no such command")
            continue
        known = options(command)
        for w in rest:
            flag = w.split("=", 1)[0]
            if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in known:
                out.append(f"`{' '.join(['rstar2', *path])}` has no option {flag}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_and_flag_a_page_names_exists(page):
    found = [f"{page.name}: {p} (in: {s})" for s in snippets(page.read_text()) for p in problems(s)]
    assert not found, "\n".join(found)


def test_the_check_sees_a_wrong_command_and_a_wrong_flag():
    assert problems("rstar2 eval aime24 --n 4") == [] == problems("rstar2 train rl --recipe r  # --not-a-flag")
    assert problems("rstar2 eval aime24 --samples 4") == ["`rstar2 eval run` has no option --samples"]
    assert problems("rstar2 evaluate aime24") == ["`rstar2 evaluate`: no such command"]
    assert problems("rstar2 serve --no-such-flag 1") == ["`rstar2 serve` has no option --no-such-flag"]
