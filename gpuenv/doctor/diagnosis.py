"""Run the diagnosis classes on one node, compare nodes, and turn their readings into Results.

``diagnose`` runs each class's reader against a ``System`` (one node, real or a fixture);
a reader that raises gives that class an ERROR naming the exception, never a PASS.
``compare`` is the cross-node step: classes 7 and 9 add findings on the node that differs.
Standard library only (with gpuenv.results): it runs on the nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from gpuenv.doctor import acs, bound, driver, envvars, fabric, mpi, nccl, nccl_known, netif, rdma
from gpuenv.doctor.findings import CLASSES, ClassReading, to_result
from gpuenv.doctor.system import System
from gpuenv.results import Result

Reader = Callable[[System], ClassReading]


def readers(address: str | None) -> dict[int, Reader]:
    return {
        1: driver.driver_version,
        2: fabric.fabric_manager,
        3: driver.module_flavour,
        4: driver.secure_boot,
        5: driver.next_boot_module,
        6: acs.pcie_acs,
        7: rdma.gpudirect_rdma,
        8: lambda system: netif.socket_ifname(system, address),
        9: nccl.nccl_libraries,
        10: envvars.stray_env,
        11: bound.driver_bound,
        12: nccl_known.nccl_known_bad,
        13: mpi.mpi_device_buffers,
    }


def diagnose(
    system: System, address: str | None = None, only: Sequence[int] | None = None
) -> list[ClassReading]:
    readings = []
    for number, reader in readers(address).items():
        if only and number not in only:
            continue
        start = time.monotonic()
        try:
            reading = reader(system)
        except Exception as exc:  # a reader's bug must not hide the other classes
            reading = ClassReading(number, error=f"reader failed: {type(exc).__name__}: {exc}")
        reading.duration_s = time.monotonic() - start
        readings.append(reading)
    return readings


def compare(by_node: Mapping[str, Sequence[ClassReading]]) -> None:
    """The cross-node step, in place: classes 7 (GPUDirect RDMA) and 9 (NCCL libraries)."""
    for number, step in ((7, rdma.compare), (9, nccl.compare)):
        step({n: v for n, vs in by_node.items() for v in vs if v.cls == number and not v.error})


def results(node: str, readings: Sequence[ClassReading]) -> list[Result]:
    return [to_result(node, v) for v in readings]


def class_numbers(text: str) -> list[int]:
    """``--only`` values: class numbers or names, comma-separated; ValueError names a bad one."""
    known = {str(c.number): c.number for c in CLASSES} | {c.name: c.number for c in CLASSES}
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in wanted if w not in known]
    if bad or not wanted:
        names = ", ".join(f"{c.number}:{c.name}" for c in CLASSES)
        raise ValueError(f"unknown class(es) {', '.join(bad) or '(none given)'}; known: {names}")
    return sorted({known[w] for w in wanted})
