"""``gpuenv bundle``: an offline bundle (signed apt repository + wheels) for one pins file."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuenv.cli import argtypes
from gpuenv.errors import BadInput


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bundle",
        help="build an offline bundle: a signed apt repository and a wheel folder",
        description="Download, in a container of the pins file's distribution, every .deb the "
        "roles install with their dependencies into a flat apt repository signed with a key made "
        "for this bundle, and build the Python wheels the roles install. Serve the folder over "
        "HTTP inside the site and point gpuenv_apt_bundle_url and gpuenv_apt_bundle_key at it "
        "(docs/sources.md). The package lists come from the roles, asked through Ansible "
        "(playbooks/bundle_packages.yml). Exit 2 on bad input, before anything is downloaded.",
    )
    p.add_argument(
        "--pins",
        required=True,
        metavar="NAME|FILE",
        help="a pins file of inventory/pins (debian-12, debian-13, ...) or its path",
    )
    p.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="new or empty folder to fill"
    )
    p.add_argument(
        "--image",
        help="image of the pins' distribution to build in; default: the lab's node image "
        "(gpuenv lab build) for Debian pins",
    )
    p.add_argument(
        "--network", help="docker network of the build container (default: docker's bridge)"
    )
    p.add_argument(
        "--driver-mode",
        default="both",
        choices=("userspace", "full", "both"),
        help="NVIDIA driver packages: userspace (no kernel module), full, or both (default)",
    )
    p.add_argument("--deb", action="append", default=[], metavar="PKG", help="one more .deb")
    p.add_argument(
        "--wheel",
        action="append",
        default=[],
        type=argtypes.requirement,
        metavar="REQ",
        help="one more pip requirement",
    )
    p.add_argument(
        "--torch",
        default=None,
        type=argtypes.requirement,
        metavar="REQ",
        help="add PyTorch (e.g. torch==2.13.0)",
    )
    p.add_argument(
        "--find-links",
        metavar="DIR",
        help="a folder of wheels pip may take from besides the index (e.g. a CPU build of torch)",
    )
    p.add_argument(
        "--cpu-only",
        action="store_true",
        help="leave out what only GPU nodes install (nvidia-ml-py, CuPy)",
    )
    p.add_argument(
        "--no-gpuenv", action="store_true", help="leave out gpuenv's wheel and its dependencies"
    )
    p.add_argument(
        "--plan", action="store_true", help="print the plan as JSON and stop (no docker)"
    )
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    from gpuenv.bundle.build import build_bundle, validate_output
    from gpuenv.bundle.plan import plan_bundle

    plan = plan_bundle(
        args.pins,
        driver_mode=args.driver_mode,
        extra_debs=tuple(args.deb),
        extra_wheels=tuple(args.wheel),
        torch=args.torch or "",
        gpu_wheels=not args.cpu_only,
        with_gpuenv=not args.no_gpuenv,
    )
    output = validate_output(Path(args.output))
    find_links = Path(args.find_links).resolve() if args.find_links else None
    if find_links is not None and not find_links.is_dir():
        raise BadInput(f"--find-links {args.find_links} is not a folder")
    if args.plan:
        json.dump(asdict(plan), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    image = args.image or _default_image(plan.os, plan.codename)

    from gpuenv.bundle.container import build_container, check_image, docker_client
    from gpuenv.report.live import Steps

    client = docker_client()
    check_image(client, image)
    if args.network:
        _check_network(client, args.network)
    output.mkdir(exist_ok=True)
    with (
        Steps() as steps,
        build_container(client, image, output, args.network, find_links) as executor,
    ):
        manifest = build_bundle(plan, output, executor, steps, find_links=find_links is not None)
    print(
        f"gpuenv bundle: {manifest.pins} ({manifest.distribution}): {len(manifest.debs)} .deb "
        f"({manifest.deb_bytes / 1e6:.0f} MB), {len(manifest.wheels)} wheels "
        f"({manifest.wheel_bytes / 1e6:.0f} MB) in {output}; key {manifest.key_fingerprint}"
    )
    for entry in manifest.node_specific:
        print(
            f"gpuenv bundle: note: not included, depends on the node: {entry}; "
            "add it by name with --deb",
            file=sys.stderr,
        )
    return 0


def _default_image(os_name: str, codename: str) -> str:
    from gpuenv.lab.settings import DISTROS, Names

    if os_name != "Debian" or codename not in DISTROS:
        raise BadInput(
            f"no default build image for {os_name} {codename}: give --image with an image of it"
        )
    return Names.from_env().node_image(codename)


def _check_network(client: Any, name: str) -> None:
    from docker.errors import NotFound

    try:
        client.networks.get(name)
    except NotFound:
        raise BadInput(f"no docker network {name!r}") from None
