"""Read what roles/mpi needs from a node, in one call, and print it as JSON.

Runs on the node (ansible.builtin.command: python3 -c <this file> ARGS) and changes nothing:
    COUNT_GPUS(0|1) FACT_FILE PACKAGE[,PACKAGE...]
Prints: the packages installed, the GPUs nvidia-smi lists (null when not asked), and Open MPI's
version, CUDA awareness and build stamp (null when ompi_info is missing or fails).

ompi_info --all takes a quarter of a second or more. Its answer is recorded in FACT_FILE with a
stamp of the files that decide it (ompi_info and the Open MPI libraries it loads: path, inode,
size, mtime); while the stamp is unchanged the recorded answer is used, otherwise ompi_info runs.
"""

import hashlib
import json
import os
import re
import shutil
import sys

if "run" not in globals():  # run as a file (tests): the helpers come from roles/gpuenv_common
    sys.path.insert(
        0, os.path.join(os.path.dirname(__file__), "..", "..", "gpuenv_common", "files")
    )
    from probe_lib import installed, run


def gpus() -> int:
    rc, out = run(["nvidia-smi", "--list-gpus"])
    return sum(1 for line in out.splitlines() if re.match(r"GPU [0-9]+:", line)) if rc == 0 else 0


def build_stamp() -> str | None:
    """A digest of ompi_info's and the Open MPI libraries' identity; None when unknown."""
    found = shutil.which("ompi_info")
    if not found:
        return None
    exe = os.path.realpath(found)
    rc, out = run(["ldd", exe])
    libs = set(re.findall(r"=> (/\S*lib(?:mpi|open-pal|open-rte)\.\S*)", out))
    if rc != 0 or not libs:
        return None
    parts = []
    for path in [exe, *sorted(os.path.realpath(lib) for lib in libs)]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        parts.append(f"{path}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def recorded(fact_file: str) -> dict:
    try:
        with open(fact_file, encoding="utf-8") as handle:
            fact = json.load(handle)
    except (OSError, ValueError):
        return {}
    return fact if isinstance(fact, dict) else {}


def ompi(fact_file: str) -> dict | None:
    stamp = build_stamp()
    fact = recorded(fact_file)
    if stamp and fact.get("ompi_build") == stamp and fact.get("version"):
        return {
            "version": fact["version"],
            "cuda_aware": fact.get("cuda_aware") is True,
            "build": stamp,
        }
    rc, out = run(["ompi_info", "--parsable", "--all"])
    version = re.search(r"ompi:version:full:([0-9]\S*)", out)
    if rc != 0 or not version:
        return None
    return {
        "version": version.group(1),
        "cuda_aware": "mpi_built_with_cuda_support:value:true" in out,
        "build": stamp or "",
    }


def main(count_gpus: str, fact_file: str, packages: str) -> None:
    state = {
        "debs": installed([name for name in packages.split(",") if name]),
        "gpus": gpus() if count_gpus == "1" else None,
        "ompi": ompi(fact_file),
    }
    print(json.dumps(state))


if __name__ == "__main__":
    main(*sys.argv[1:])
