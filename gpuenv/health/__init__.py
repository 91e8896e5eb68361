"""`gpuenv health`: a passive one-shot scan of one node's GPUs, NVSwitches and InfiniBand ports
(docs/health.md). ``scan(root, run, nvml, thresholds, state) -> HealthReport`` is the API."""
