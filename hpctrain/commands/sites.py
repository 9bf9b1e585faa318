"""``hpctrain sites list|show|validate``: the machines hpctrain knows and checks of new profile files."""

from __future__ import annotations

import argparse

from hpctrain.commands.output import print_json, print_table
from hpctrain.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sites", help="list, show and validate site profiles")
    sub = parser.add_subparsers(dest="sites_command", metavar="ACTION")
    sub.required = True

    p_list = sub.add_parser("list", help="site profiles on the search path")
    p_list.add_argument("--json", action="store_true")
    p_list.set_defaults(handler=cmd_list)

    p_show = sub.add_parser("show", help="one profile, resolved after 'extends'")
    p_show.add_argument("site", help="site name or path to a YAML file")
    p_show.add_argument("--json", action="store_true")
    p_show.set_defaults(handler=cmd_show)

    p_val = sub.add_parser("validate", help="validate profile files (exit 2 on the first invalid one)")
    p_val.add_argument("paths", nargs="+", metavar="PATH")
    p_val.add_argument("--json", action="store_true")
    p_val.set_defaults(handler=cmd_validate)


def cmd_list(args: argparse.Namespace) -> int:
    from hpctrain.config.site import available_sites, load_site_file

    rows = []
    for name, path in sorted(available_sites().items()):
        try:
            site = load_site_file(path)
            rows.append({"name": name, "scheduler": site.scheduler, "launcher": site.launcher,
                         "description": site.description, "path": str(path), "valid": True})
        except ConfigError as exc:
            rows.append({"name": name, "scheduler": "?", "launcher": "?", "description": f"INVALID: {exc}",
                         "path": str(path), "valid": False})
    if args.json:
        print_json(rows)
    else:
        print_table(["NAME", "SCHEDULER", "LAUNCHER", "DESCRIPTION"],
                    [[r["name"], r["scheduler"], r["launcher"], r["description"]] for r in rows])
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    import yaml

    from hpctrain.config.site import load_site

    site = load_site(args.site)
    data = site.model_dump(mode="json", exclude_none=True)
    if args.json:
        print_json(data)
    else:
        print(yaml.safe_dump(data, sort_keys=False).rstrip())
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from hpctrain.config.site import load_site_file
    from hpctrain.errors import ConfigErrors

    results = []
    failed = False
    for path in args.paths:
        try:
            site = load_site_file(path)
            results.append({"path": path, "valid": True, "name": site.name, "errors": []})
        except ConfigError as exc:
            failed = True
            errors = exc.errors if isinstance(exc, ConfigErrors) else [exc]
            results.append({"path": path, "valid": False, "errors": [
                {"line": e.line, "key": e.key, "message": e.message, "hint": e.hint, "text": str(e)}
                for e in errors]})
    if args.json:
        print_json(results)
    else:
        import sys

        for r in results:
            if r["valid"]:
                print(f"{r['path']}: ok ({r['name']})")
            else:
                for e in r["errors"]:
                    print(f"hpctrain: error: {e['text']}", file=sys.stderr)
    return 2 if failed else 0
