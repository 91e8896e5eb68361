"""Errors shared by every part of gpuenv; the CLI maps them to exit codes."""


class GpuenvError(Exception):
    """A failure the user can act on; the message says what and where."""

    exit_code = 1


class BadInput(GpuenvError):
    """The user's input (arguments, inventory, files) is wrong; nothing was run."""

    exit_code = 2


class EnvironmentProblem(GpuenvError):
    """The controller lacks something it needs (docker not running, a tool missing)."""

    exit_code = 1
