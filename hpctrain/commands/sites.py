"""``hpctrain sites list|show|validate|discover|forget-nodes``: the machines hpctrain knows, checks of new profile
files, and the nodes remembered as bad on a site (blamed as failed by two of your runs there)."""

from __future__ import annotations

import argparse

from hpctrain.commands.output import print_json, print_table
from hpctrain.errors import ConfigError, ConfigErrors
from hpctrain.text import printable


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

    p_forget = sub.add_parser("forget-nodes", help="forget nodes remembered as bad on a site (all when none named)")
    p_forget.add_argument("site", help="site name or path to a YAML file")
    p_forget.add_argument("nodes", nargs="*", metavar="NODE", help="the nodes to forget (default: all)")
    p_forget.set_defaults(handler=cmd_forget_nodes)

    p_val = sub.add_parser("validate", help="validate profile files (exit 2 on the first invalid one)")
    p_val.add_argument("paths", nargs="+", metavar="PATH")
    p_val.add_argument("--json", action="store_true")
    p_val.set_defaults(handler=cmd_validate)

    _register_discover(sub)


def cmd_list(args: argparse.Namespace) -> int:
    from hpctrain.config.site import available_sites, load_site_file

    rows = []
    for name, path in sorted(available_sites().items()):
        try:
            site = load_site_file(path)
            rows.append({"name": name, "scheduler": site.scheduler, "launcher": site.launcher,
                         "description": site.description, "path": str(path), "valid": True, "error": None})
        except (ConfigError, OSError) as exc:
            # One broken file (someone's draft in ~/.config/hpctrain/sites) is listed, never fatal.
            errors = exc.errors if isinstance(exc, ConfigErrors) else [exc]
            first = str(ConfigError.__str__(errors[0]) if isinstance(errors[0], ConfigError) else errors[0])
            more = f" (+{len(errors) - 1} more: hpctrain sites validate {path})" if len(errors) > 1 else ""
            rows.append({"name": name, "scheduler": "?", "launcher": "?", "description": f"BROKEN: {first}{more}",
                         "path": str(path), "valid": False, "error": str(exc)})
    if args.json:
        print_json(rows)
    else:
        print_table(["NAME", "SCHEDULER", "LAUNCHER", "DESCRIPTION"],
                    [[_one_line(r["name"]), r["scheduler"], r["launcher"], _one_line(r["description"])] for r in rows])
    return 0


def _one_line(text: str) -> str:
    """Text for one table cell: a file name or message with control characters cannot break the table."""
    return printable(text)


def cmd_show(args: argparse.Namespace) -> int:
    import yaml

    from hpctrain.config.site import load_site

    site = load_site(args.site)
    data = site.model_dump(mode="json", exclude_none=True)
    remembered = _remembered(site.name)
    if args.json:
        print_json({**data, "remembered_nodes": remembered} if remembered else data)
    else:
        print(yaml.safe_dump(data, sort_keys=False).rstrip())
        if remembered:
            # YAML comments: the output still loads as the profile
            print(f"# nodes remembered as bad on {site.name} (submit and resume keep jobs off them; "
                  f"`hpctrain sites forget-nodes {site.name} [NODE ...]` forgets them):")
            for entry in remembered:
                for run in entry["runs"]:
                    print(printable(f"#   {entry['node']}: run {run['run_id']}: {run['cause']}"))
    return 0


def _remembered(site: str) -> list[dict[str, object]]:
    """The nodes remembered as bad on ``site``, each with the runs that blamed it and why."""
    from hpctrain.submission.registry import RunRegistry

    with RunRegistry(readonly=True) as registry:
        found = registry.remembered_nodes(site)
    return [{"node": node, "runs": [{"run_id": f.run_id, "cause": f.blame.cause, "source": f.blame.source,
                                     "job": f.blame.job} for f in blames]}
            for node, blames in found.items()]


def cmd_forget_nodes(args: argparse.Namespace) -> int:
    import sys

    from hpctrain.config.site import load_site
    from hpctrain.submission.blamed_nodes import checked_node_name
    from hpctrain.submission.registry import RunRegistry

    names = [checked_node_name(n, "NODE") for n in args.nodes]
    try:
        site = load_site(args.site).name
    except ConfigError:
        site = args.site  # a site whose profile is gone may still have remembered nodes
    with RunRegistry() as registry:
        forgotten = registry.forget_nodes(site, names)
    not_remembered = [n for n in names if n not in forgotten]
    if forgotten:
        print(f"forgot {', '.join(forgotten)} on {site}: submit and resume may use them again")
    else:
        print(f"no node is remembered as bad on {site}" + (" among those named" if names else ""))
    if not_remembered:
        print(f"note: {', '.join(not_remembered)} {'was' if len(not_remembered) == 1 else 'were'} not remembered "
              f"on {site}", file=sys.stderr)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from hpctrain.config.site import load_site_file
    from hpctrain.submission.schedulers.base import get_scheduler

    results = []
    failed = False
    for path in args.paths:
        try:
            site = load_site_file(path)
            try:
                get_scheduler(site.scheduler).check_site(site)  # what the scheduler itself cannot run (its launchers)
            except ConfigError as exc:
                raise _placed_in(exc, path) from None
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
                    print(f"hpctrain: error: {printable(e['text'])}", file=sys.stderr)
    return 2 if failed else 0


def _placed_in(exc: ConfigError, path: str) -> ConfigError:
    """A back-end's refusal of a profile, placed at the key's line in the profile's file (or its first line when
    the key comes from the profile it extends)."""
    from hpctrain.config.yamlio import load_yaml_file

    if exc.path is None:
        exc.path = str(path)
        exc.line = load_yaml_file(path).line_of(tuple((exc.key or "").split("."))) if exc.key else None
    return exc


# --- discover (hpctrain/submission/discovery) -----------------------------------------------------------------


def _register_discover(sub: argparse._SubParsersAction) -> None:
    p_disc = sub.add_parser(
        "discover", help="write a new site's profile from what its scheduler reports (or --check one)",
        description="Ask the scheduler on the login node (here, or --remote over ssh; one round trip) for its "
                    "queues, limits and node shape and print a validated site profile: each value's source as a "
                    "comment, what it could not learn under `guessed:` and in a to-do list. --check FILE "
                    "compares an existing profile with the machine instead (exit 0: no differences, 2: some).")
    p_disc.add_argument("--remote", default=None, metavar="USER@LOGIN",
                        help="discover over ssh on this login node (one ControlMaster connection)")
    p_disc.add_argument("--ssh-config", default=None, metavar="FILE", help="ssh client config (ssh -F FILE)")
    p_disc.add_argument("--name", default=None, help="the profile's name (default: the cluster's or host's name)")
    p_disc.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="write the profile to FILE (atomically; an existing FILE needs --force)")
    p_disc.add_argument("--force", action="store_true", help="replace an existing -o FILE")
    p_disc.add_argument("--check", default=None, metavar="FILE",
                        help="compare this profile (file or site name) with what the machine reports now")
    p_disc.set_defaults(handler=cmd_discover)


def cmd_discover(args: argparse.Namespace) -> int:
    import sys

    from hpctrain.exit_codes import EXIT_CONFIG
    from hpctrain.submission.discovery.check import compare_profile
    from hpctrain.submission.discovery.detect import discover
    from hpctrain.submission.discovery.profile import draft_profile, write_profile
    from hpctrain.submission.transport import LocalTransport, SSHTransport, Transport

    if args.check and (args.output or args.name or args.force):
        raise ConfigError("--check compares a profile with the machine and writes nothing",
                          hint="drop -o/--name/--force, or drop --check to write a new profile")
    if args.ssh_config and not args.remote:
        raise ConfigError("--ssh-config is for --remote", hint="add --remote USER@LOGIN")
    transport: Transport = SSHTransport(args.remote, ssh_config=args.ssh_config) if args.remote else LocalTransport()
    if args.check:
        from hpctrain.config.site import load_site

        profile = load_site(args.check)
        findings = discover(transport, args.remote)
        result = compare_profile(profile, findings)
        for note in result.notes:
            print(f"note: {printable(note)}")
        where = f"{findings.host} ({findings.scheduler.name})"
        if not result.differences:
            print(f"{printable(args.check)}: matches what {where} reports")
            return 0
        print(f"{printable(args.check)}: {len(result.differences)} difference(s) with what {where} reports:")
        for difference in result.differences:
            print(f"  {printable(difference.text())}")
        return EXIT_CONFIG

    findings = discover(transport, args.remote)
    draft = draft_profile(findings, args.name)
    report = sys.stderr
    if args.output:
        path = write_profile(draft.text, args.output, force=args.force)
        report = sys.stdout
        shown = printable(str(path))
        print(f"wrote {shown}: site {draft.profile.name!r} ({draft.profile.scheduler}, {len(draft.profile.queues)} "
              f"queues); use it with --site {shown}")
    else:
        sys.stdout.write(draft.text)
        sys.stdout.flush()
    for note in draft.notes:
        print(f"note: {printable(note)}", file=report)
    if draft.todo:
        print(f"to do: {len(draft.todo)} value(s) are guesses; check them in the profile, then remove them from "
              "`guessed:`", file=report)
        for item in draft.todo:
            print(f"  - {printable(item)}", file=report)
    return 0
