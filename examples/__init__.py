"""The seed documents' methods as programs that run as written (docs/examples.md).

Each file runs by itself the way its method is used (``mpirun``, ``torchrun``, ``horovodrun`` or
``python3``), fixes the document's bugs (listed at its top), checks its own answer and ends with
one line ``EXAMPLE-RESULT {json}``. The folder is also the package ``gpuenv.examples`` (mapped in
pyproject.toml), so that the files travel inside gpuenv's wheel to the nodes, where
``gpuenv check --profile examples`` runs and judges them (gpuenv.checks.examples).
"""
