"""The thread settings keel's kernel applies (kernel/run/process_settings.cpp, configure_threads), for the
Python side of a benchmark: LibTorch intra-op threads on every core; OpenBLAS, when it is the
OpenMP build (openblas_get_parallel() == 2, what setup.sh selects), on the same threads (one
pool), else on one thread (its pthread pool would spin against LibTorch's)."""
import ctypes
import os

import torch


def apply():
    """Applies keel's settings to this process; returns a line that describes them."""
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    try:
        blas = ctypes.CDLL("libopenblas.so.0")
    except OSError:
        return f"{threads} LibTorch threads, BLAS not OpenBLAS (threads left as they are)"
    openmp = blas.openblas_get_parallel() == 2
    blas.openblas_set_num_threads(threads if openmp else 1)
    return (f"{threads} LibTorch threads, OpenBLAS "
            f"({'OpenMP' if openmp else 'not OpenMP'}) {blas.openblas_get_num_threads()}")
