"""Where the controller's tools are: beside the interpreter gpuenv runs under, then ``PATH``.

Installing the controller extra (``pip install '.[controller]'`` from a checkout) puts
``ansible-inventory``, ``ansible-playbook`` and the rest in the same ``bin/`` as the venv's
``python``; a user who runs ``/opt/venv/bin/gpuenv`` without
activating the venv has that folder off ``PATH``. The folder is taken as ``sys.executable`` names
it, symbolic links left alone: a venv's ``python`` is a link to the system interpreter, whose
folder holds none of the venv's tools.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def interpreter_bin() -> Path:
    """The folder of the running interpreter, as ``sys.executable`` names it (links kept)."""
    return Path(os.path.abspath(sys.executable)).parent


def find(name: str) -> str | None:
    """The path of ``name`` beside the interpreter, else on ``PATH``; None when neither has it."""
    return shutil.which(name, path=str(interpreter_bin())) or shutil.which(name)
