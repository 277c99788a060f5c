"""`quantscan case save|list|show`: the case library.
"""

from __future__ import annotations

import argparse
from typing import Any

from quantscan.cli.args import EXIT_OK, Parser


def case_parser(sub: Any) -> None:
    case = sub.add_parser("case", help="the case library: rewrite recipes with their proofs, reused across models")
    actions = case.add_subparsers(dest="case_action", parser_class=Parser, required=True)
    save = actions.add_parser("save", help="record a run (a scan of the rewritten model) as a case")
    save.add_argument("run_dir")
    save.add_argument("--note", required=True, help="what the problem was and why the recipe fixes it")
    save.add_argument("--rewrite", action="append", default=[], metavar="FILE",
                      help="rewrite record(s) (default: <model>.rewrite.json beside the run's model)")
    save.add_argument("--profile", default=None, help="chip profile (default: the run's --profile)")
    listing = actions.add_parser("list", help="the library's cases, one per line, id first")
    show = actions.add_parser("show", help="one case as JSON")
    show.add_argument("case_id")
    for p in (save, listing, show):
        p.add_argument("--cases", default=None, metavar="DIR",
                       help="library folder (default $QUANTSCAN_CASES or ~/.quantscan/cases)")
        p.add_argument("--debug", action="store_true")


def cmd_case(args: argparse.Namespace) -> int:
    import json as _json

    from quantscan.cases import list_cases, load_case, save_case

    if args.case_action == "save":
        folder = save_case(args.run_dir, args.note, cases=args.cases, rewrite_records=args.rewrite,
                           profile=args.profile)
        case = load_case(folder.name, args.cases)
        print(f"saved case {case['id']} in {folder} (pattern: {len(case['pattern'])} finding kind(s), "
              f"recipe: {' + '.join(case['recipe'])})")
        return EXIT_OK
    if args.case_action == "list":
        for case in list_cases(args.cases):
            print(f"{case['id']}  {case.get('profile', '')}  {' + '.join(case.get('recipe', []))}  "
                  f"{case.get('note', '')}")
        return EXIT_OK
    print(_json.dumps(load_case(args.case_id, args.cases), indent=1))
    return EXIT_OK
