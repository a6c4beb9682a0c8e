"""What every pytest run here shares (tests/ and nbval over notebooks/): under pytest-xdist, each
worker's share of the cores."""

import os


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs one worker per core) each worker takes its share of
    the cores, for torch here and for the processes it starts (OMP_NUM_THREADS: isolated runs,
    nbval's Jupyter kernels). Two workers of two OpenMP threads each on two cores spin against
    each other and run many times slower than one. An OMP_NUM_THREADS set by the caller wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "PYTEST_XDIST_WORKER" in os.environ:
        import torch

        share = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", str(share))))
