"""gpuenv: provision and validate multi-GPU, multi-node NVIDIA clusters."""

__version__ = "0.1.0"
