"""`quantscan report RUN_DIR`: rebuild report.html.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from quantscan.cli.args import EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from quantscan.report.html import write_report

    path = write_report(Path(args.run_dir))
    print(f"wrote {path}")
    return EXIT_OK
