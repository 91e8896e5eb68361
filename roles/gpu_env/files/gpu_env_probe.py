"""Read what roles/gpu_env needs from a node, in one call, and print it as JSON.

Runs on the node (ansible.builtin.command: python3 -c <this file> ARGS) and changes nothing:
    COUNT_GPUS(0|1) CUDA_HOME CANDIDATE[,CANDIDATE...] READ_NVCC(0|1) VENV MARKER PACKAGE[,...]
Prints: the packages installed; the NVIDIA display/3D controllers on the PCI bus (null when not
asked); the CUDA home (CUDA_HOME when given, else the first candidate holding bin/nvcc; empty when
none), whether it has lib64, and the CUDA major nvcc reports (when asked); whether the venv has
bin/python, the distributions installed in it (normalized name: version), and the content of the
marker file naming the gpuenv build it holds (null when missing).
"""

import glob
import json
import os
import re
import sys

if "run" not in globals():  # run as a file (tests): the helpers come from roles/gpuenv_common
    sys.path.insert(
        0, os.path.join(os.path.dirname(__file__), "..", "..", "gpuenv_common", "files")
    )
    from probe_lib import distributions, installed, run


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def pci_gpus() -> int:
    """NVIDIA (vendor 0x10de) display controllers (class 0x03xx) on the PCI bus."""
    count = 0
    for device in glob.glob("/sys/bus/pci/devices/*"):
        vendor = (read(device + "/vendor") or "").strip()
        klass = read(device + "/class") or ""
        count += vendor == "0x10de" and klass.startswith("0x03")
    return count


def cuda(home: str, candidates: list[str], read_nvcc: bool) -> dict:
    if not home:
        home = next((c for c in candidates if os.path.lexists(c + "/bin/nvcc")), "")
    major = ""
    if home and read_nvcc:
        _, out = run([home + "/bin/nvcc", "--version"])
        found = re.search(r"release ([0-9]+)\.", out)
        major = found.group(1) if found else ""
    return {"home": home, "lib64": bool(home) and os.path.lexists(home + "/lib64"), "major": major}


def venv(path: str) -> dict:
    dists = {name: version for name, (version, _) in distributions(path).items()}
    return {"python": os.path.lexists(path + "/bin/python"), "dists": dists}


def main(
    count_gpus: str,
    cuda_home: str,
    candidates: str,
    read_nvcc: str,
    venv_path: str,
    marker: str,
    packages: str,
) -> None:
    content = read(marker)
    state = {
        "debs": installed([name for name in packages.split(",") if name]),
        "pci_gpus": pci_gpus() if count_gpus == "1" else None,
        "cuda": cuda(cuda_home, [c for c in candidates.split(",") if c], read_nvcc == "1"),
        "venv": venv(venv_path),
        "marker": content.strip() if content is not None else None,
    }
    print(json.dumps(state))


if __name__ == "__main__":
    main(*sys.argv[1:])
