"""The thread settings keel's kernel applies (kernel/run/process_settings.cpp, configure_threads), for the
Python side of a benchmark: LibTorch intra-op threads on every core; OpenBLAS, when this process's
torch loaded it and it is the OpenMP build (openblas_get_parallel() == 2, what setup.sh selects),
on the same threads (one pool), else on one thread (its pthread pool would spin against
LibTorch's). A torch that carries its own BLAS (the pip wheel's MKL inside libtorch_cpu) runs it
on LibTorch's OpenMP threads, as keel built against that LibTorch does: nothing to set."""
import ctypes
import os

import torch


def _openblas_loaded():
    """Whether libopenblas is mapped into this process (Debian's python3-torch loads it through
    libblas.so.3; the wheel does not, and loading it here would only add a pool nobody uses;
    numpy's own libscipy_openblas64_ does not count: torch does not call it)."""
    try:
        with open("/proc/self/maps") as f:
            return any("/libopenblas" in line for line in f)
    except OSError:
        return False


def environment():
    """One line: the environment variables that change both sides' speed (OpenMP's wait policy,
    glibc's allocator thresholds), as this process got them."""
    names = ("OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    return ", ".join(f"{n}={os.environ.get(n, '(unset)')}" for n in names)


def apply():
    """Applies keel's settings to this process; returns a line that describes them."""
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    if not _openblas_loaded():
        blas = "MKL" if torch.backends.mkl.is_available() else "not OpenBLAS"
        return (f"torch {torch.__version__}, {threads} LibTorch threads, BLAS {blas} (on LibTorch's "
                f"threads); {environment()}")
    blas = ctypes.CDLL("libopenblas.so.0")
    openmp = blas.openblas_get_parallel() == 2
    blas.openblas_set_num_threads(threads if openmp else 1)
    return (f"torch {torch.__version__}, {threads} LibTorch threads, OpenBLAS "
            f"({'OpenMP' if openmp else 'not OpenMP'}) {blas.openblas_get_num_threads()}; "
            f"{environment()}")
