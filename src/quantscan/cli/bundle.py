"""`quantscan bundle RUN_DIR -o OUT.zip`: the hand-over bundle.
"""

from __future__ import annotations

import argparse

from quantscan.cli.args import EXIT_OK


def cmd_bundle(args: argparse.Namespace) -> int:
    from quantscan.bundle import make_bundle

    bundle = make_bundle(args.run_dir, args.bundle_out, include=args.include, force=args.force)
    print(f"wrote {bundle.path} ({len(bundle.members)} files)")
    return EXIT_OK
