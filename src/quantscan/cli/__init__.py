"""The command line: the only package that parses arguments, prints, or exits (one module per command).

`quantscan.cli:main` is the console entry point (pyproject.toml); `python -m quantscan` calls it too.
"""

from quantscan.cli.main import build_parser, main, normalize_argv

__all__ = ["build_parser", "main", "normalize_argv"]
