"""A stand-in for the node's gpuenv in the unit tests of the Slurm health-check script: the real
CLI (gpuenv.cli.main) with one fault injected, chosen by $FAKE_GPUENV_FAULT. The fault is in
every call, as a broken install would be: a call that does not reach the faulty code runs as the
real gpuenv does.

  none         the real gpuenv
  import       gpuenv cannot start: a module it needs is missing (ModuleNotFoundError, exit 1)
  before-scan  an exception before the scan (loading the thresholds): a traceback, exit 1
  after-scan   an exception after the scan wrote its verdict, before Slurm is told: exit 1
  segfault     the scan dies of SIGSEGV (as when the NVML library crashes)
  hang         the scan never ends
"""

import os
import signal
import sys
import time

FAULT = os.environ.get("FAKE_GPUENV_FAULT", "none")

if FAULT == "import":
    import gpuenv_injected_missing  # noqa: F401

from gpuenv.checks import thresholds  # noqa: E402
from gpuenv.cli import main  # noqa: E402
from gpuenv.health import scan, slurm  # noqa: E402


def _before_scan(*args: object, **kwargs: object) -> None:
    raise RuntimeError("injected before the scan")


def _after_scan(*args: object, **kwargs: object) -> None:
    raise TypeError("injected after the scan")


def _segfault(*args: object, **kwargs: object) -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _hang(*args: object, **kwargs: object) -> None:
    time.sleep(600)


if FAULT == "before-scan":
    thresholds.load_thresholds = _before_scan
elif FAULT == "after-scan":
    slurm.enforce = _after_scan
elif FAULT == "segfault":
    scan.scan = _segfault
elif FAULT == "hang":
    scan.scan = _hang
elif FAULT != "none":
    sys.exit(f"fake gpuenv: unknown FAKE_GPUENV_FAULT {FAULT!r}")

sys.exit(main())
