"""The seed documents' methods as programs that run as written (docs/examples.md).

Each file runs by itself the way its method is used (``mpirun``, ``torchrun``, ``horovodrun`` or
``python3``), fixes the document's bugs (listed at its top), checks its own answer and ends with
one line ``EXAMPLE-RESULT {json}``.

On a CPU-only node too: mpi_cupy (``--array numpy``), dask_cupy (numpy blocks), ddp_torchrun
(gloo), tf_mirrored (two logical CPU devices), horovod_cupy (``--array numpy``). A GPU only:
nccl_cupy_mpi (one GPU per rank), pycuda_kernel (and nvcc).

The folder is also the package ``gpuenv.examples`` (mapped in pyproject.toml), so that the files
travel inside gpuenv's wheel to the nodes, where ``gpuenv check --profile examples`` runs and
judges them (gpuenv.checks.examples).
"""
