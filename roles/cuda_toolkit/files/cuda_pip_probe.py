"""The CUDA wheels of roles/cuda_toolkit's pip method on a node, printed as JSON.

Runs on the node (python3 -c <probe_lib.py + this file> HOME PACKAGE[,PACKAGE...] DEB...) and
changes nothing. Prints: "wheels", the version of each PACKAGE installed in the virtual
environment HOME, and "debs", which of the Debian packages DEB... (what the pip module needs) are
installed.
"""

import json
import os
import sys

if "run" not in globals():  # run as a file (tests): the helpers come from roles/gpuenv_common
    sys.path.insert(
        0, os.path.join(os.path.dirname(__file__), "..", "..", "gpuenv_common", "files")
    )
    from probe_lib import distributions, installed


def main(home: str, packages: str, *debs: str) -> None:
    dists = distributions(home)
    wheels = {name: dists[name][0] for name in packages.split(",") if name in dists}
    print(json.dumps({"wheels": wheels, "debs": installed(list(debs))}))


if __name__ == "__main__":
    main(*sys.argv[1:])
