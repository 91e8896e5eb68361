"""``gpuenv cloud-init``: user data with which a new instance provisions itself (docs/cloud.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuenv.errors import BadInput


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "cloud-init",
        help="render cloud-init user data: a new instance runs site.yml on itself",
        description="Render #cloud-config user data for a new instance of an inventory group: "
        "at first boot it installs Ansible from the configured index, fetches this project at a "
        "pinned ref, runs the playbook on itself with the group's variables, runs `gpuenv check` "
        "and writes /var/lib/gpuenv/ready.json. Exit 2 on bad input (nothing written).",
    )
    p.add_argument("-i", "--inventory", required=True, help="Ansible inventory (file or folder)")
    p.add_argument("--group", required=True, help="inventory group the new instance belongs to")
    p.add_argument(
        "--source",
        metavar="URL",
        help="https:// git URL or https:// tarball URL ({ref} is replaced by the ref) of this "
        "project; default: this checkout's origin remote",
    )
    p.add_argument(
        "--ref",
        help="branch, tag or commit to fetch (a branch or tag of a git source is pinned to the "
        "commit it names now); default: this checkout's HEAD commit",
    )
    p.add_argument(
        "--sha256",
        default="",
        metavar="HEX",
        help="SHA-256 of a tarball source; the instance checks it before it unpacks anything",
    )
    p.add_argument(
        "--ca-bundle",
        default="",
        metavar="FILE",
        help="PEM file of CA certificates the instance trusts for fetching --source, and only "
        "for that (a source served under a private CA); the certificates go into the user data",
    )
    p.add_argument(
        "--secrets-command",
        default="",
        metavar="CMD",
        help="command the instance runs at boot (e.g. reading the cloud's secret store with its "
        "own role); its output, a YAML mapping of variables, is passed to the playbook as extra "
        "variables and never written to user data",
    )
    p.add_argument(
        "--allow-secret",
        action="append",
        default=[],
        metavar="PATH",
        help="let one group variable through that looks like a secret but is none, by its path "
        "as the error names it (gpu_env_extra_env.NAME, a_list[0]); repeatable. Private key "
        "material is never let through; a PATH that names no variable is exit 2",
    )
    p.add_argument(
        "--playbook",
        default="site.yml",
        help="playbook in the fetched project, relative to its root (default: %(default)s)",
    )
    p.add_argument(
        "-o", "--output", default="-", metavar="FILE", help="where to write it ('-': stdout)"
    )
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    from gpuenv.cli.argtypes import output_target
    from gpuenv.cloud import userdata

    output_target("-o", args.output, stdout_ok=True)
    root = Path(__file__).resolve().parents[2]
    origin, head = (
        userdata.checkout_defaults(root) if not (args.source and args.ref) else (None, None)
    )
    source = args.source or origin
    ref = args.ref or head
    if not source:
        raise BadInput(f"--source is required: {root} is not a git checkout with an origin remote")
    if not ref:
        raise BadInput(f"--ref is required: {root} is not a git checkout")
    rendered = userdata.render(
        userdata.Request(
            inventory=args.inventory,
            group=args.group,
            source=source,
            ref=ref,
            playbook=args.playbook,
            sha256=args.sha256,
            secrets_command=args.secrets_command,
            ca_bundle=args.ca_bundle,
            allow_secrets=tuple(args.allow_secret),
        )
    )
    if args.output == "-":
        sys.stdout.write(rendered.text)
    else:
        Path(args.output).write_text(rendered.text)
    for note in rendered.notes:
        print(f"gpuenv cloud-init: note: {note}", file=sys.stderr)
    print(
        f"gpuenv cloud-init: group {args.group}, {userdata.mask_url(source)} at {ref}, "
        f"sources preset {rendered.sources.preset}; {len(rendered.text.encode())} bytes"
        + ("" if args.output == "-" else f" written to {args.output}"),
        file=sys.stderr,
    )
    return 0
