"""Where the NCCL wheel is on a node, for roles/nccl's pip method, printed as JSON.

Runs on the node (python3 -c <probe_lib.py + this file> PACKAGE PREFIX DEB...) and changes nothing.
Prints: "system", the wheel in the node's own Python (someone else's: version and NCCL folder),
"prefix", the wheel in <PREFIX>/venv (ours), each only when present, and "debs", which of the
Debian packages DEB... (what the pip module needs) are installed.
"""

import importlib.metadata
import json
import os
import sys

if "run" not in globals():  # run as a file (tests): the helpers come from roles/gpuenv_common
    sys.path.insert(
        0, os.path.join(os.path.dirname(__file__), "..", "..", "gpuenv_common", "files")
    )
    from probe_lib import distributions, installed


def main(package: str, prefix: str, *debs: str) -> None:
    found: dict = {}
    try:
        dist = importlib.metadata.distribution(package)
        found["system"] = {"version": dist.version, "dir": str(dist.locate_file("nvidia/nccl"))}
    except importlib.metadata.PackageNotFoundError:
        pass
    ours = distributions(prefix + "/venv").get(package)
    if ours:
        found["prefix"] = {"version": ours[0], "dir": ours[1] + "/nvidia/nccl"}
    found["debs"] = installed(list(debs))
    print(json.dumps(found))


if __name__ == "__main__":
    main(*sys.argv[1:])
