"""``hpctrain schema export DIR``: JSON Schemas and the configuration reference page from the models."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("schema", help="export the configuration JSON Schemas and reference")
    sub = parser.add_subparsers(dest="schema_command", metavar="ACTION")
    sub.required = True
    p_exp = sub.add_parser("export", help="write site-profile/job-spec schemas and reference.md")
    p_exp.add_argument("directory", nargs="?", default="docs")
    p_exp.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from hpctrain.config.schema_export import export

    for path in export(args.directory):
        print(path)
    return 0
