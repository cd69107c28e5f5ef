"""The timing loop, shared by spmdsim's side and the jax.pmap subprocess so both are measured alike."""
import resource
import statistics
import time

WARMUP = 3       # calls after the first, untimed: allocators and caches settle (large arrays page-fault at first)
MIN_TIME = 0.5   # seconds of timed calls at least: a 1 ms call is repeated ~500 times, not just `repeats`


def _kernel_time() -> float:
    """CPU seconds this process has spent in the kernel (all threads): page faults, zeroing fresh memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def measure(fn, repeats: int, warmup: int = WARMUP, min_time: float = MIN_TIME) -> dict:
    """Wall time of a first call, then of at least ``repeats`` calls (more, until ``min_time`` has passed)
    after ``warmup`` untimed ones, each with the kernel time it caused (on a VM, faulting in fresh memory
    can cost 10x more than computing on it). Returns seconds: ``first_s``, ``times_s``, ``median_s``,
    ``kernel_s``, ``kernel_median_s``."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    for _ in range(warmup):
        fn()
    times, kernel = [], []
    while len(times) < repeats or sum(times) < min_time:
        k, start = _kernel_time(), time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        kernel.append(_kernel_time() - k)
    return {"first_s": first, "times_s": times, "median_s": statistics.median(times), "kernel_s": kernel,
            "kernel_median_s": statistics.median(kernel)}
