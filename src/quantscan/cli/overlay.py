"""`quantscan overlay RUN_DIR -o nodes.json`: per-node data for Model Explorer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from quantscan.cli.args import EXIT_OK


def cmd_overlay(args: argparse.Namespace) -> int:
    from quantscan.overlay import write_overlay

    paths = write_overlay(Path(args.run_dir), Path(args.overlay_out), force=args.force)
    print(f"wrote {', '.join(str(p) for p in paths)} (Model Explorer node data: load beside the model)")
    return EXIT_OK
