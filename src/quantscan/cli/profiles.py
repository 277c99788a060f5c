"""`quantscan profiles`: the shipped chip profiles.
"""

from __future__ import annotations

import argparse

from quantscan.cli.args import EXIT_OK


def cmd_profiles(args: argparse.Namespace) -> int:
    from quantscan.compat.profiles import list_profiles

    for info in list_profiles():
        fields = [getattr(info, "name", str(info))]
        for attr in ("vendor", "description"):
            value = getattr(info, attr, None)
            if value:
                fields.append(str(value))
        print("  ".join(fields))
    return EXIT_OK
