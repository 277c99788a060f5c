"""The command line: the only package that parses arguments, prints, or exits (one module per command).

`quantscan.cli:main` is the console entry point (pyproject.toml); `python -m quantscan` calls it too.
`dispatch` holds the parser, the command table and the exit codes' handling; `args` the argument groups
the commands share.
"""

from quantscan.cli.args import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_THRESHOLD
from quantscan.cli.dispatch import HANDLERS, build_parser, main, normalize_argv

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_THRESHOLD",
    "HANDLERS",
    "build_parser",
    "main",
    "normalize_argv",
]
