"""The memory benchmark of benchmarks/hosts.py: ``[mpiexec -n H] python benchmarks/_host_memory.py N BLOCK``.
A psum over N virtual devices with the vectorized executor (spmdsim.jax.pmap, NumPy front-end hosts through
spmdsim.run_hosts: no JAX devices), each device holding BLOCK float32; H hosts (MPI processes), or one process.
Host 0 prints every host's peak resident memory (MiB) before and after the call, as JSON."""
import json
import resource
import sys
import time

import jax
import numpy as np

import spmdsim
import spmdsim.jax as sjax


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def program(block: int) -> dict:
    local = spmdsim.local_device_count()
    first = spmdsim.process_index() * local  # this host's blocks of the same global data, whatever the hosts
    x = np.broadcast_to((np.arange(first, first + local, dtype=np.float32) % 7)[:, None], (local, block)).copy()
    f = sjax.pmap(lambda v: jax.lax.psum(v, "i") * 0.5 + v, "i", executor="vectorized")
    before = peak_mib()
    start = time.perf_counter()
    out = np.asarray(f(x))
    seconds = time.perf_counter() - start
    return {"local_devices": local, "before_mib": before, "peak_mib": peak_mib(), "seconds": seconds,
            "checksum": float(out[:, 0].astype(np.float64).sum())}


if __name__ == "__main__":
    n, block = int(sys.argv[1]), int(sys.argv[2])
    try:
        from mpi4py import MPI
        hosts = MPI.COMM_WORLD.Get_size()
    except ImportError:
        hosts = 1
    with spmdsim.set_device_count(n):
        results = spmdsim.run_hosts(hosts, program, block)
    if spmdsim.process_index() == 0:
        print(json.dumps({"hosts": hosts, "devices": n, "block": block, "per_host": results}), flush=True)
