"""Peak memory of one large collective, as a multiple of its input: ``python -m benchmarks.memory``.

Each case runs in its own subprocess (``python -m benchmarks.memory CASE``), which measures the peak of
NumPy's allocations during one call with tracemalloc (NumPy reports its data buffers to it) after a first,
unmeasured call. The input is 8 blocks of 64 MiB float32 (512 MiB); issue 17's bound is 1.2x.
"""
import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np

BLOCK = 16 * 1024 * 1024  # float32 elements per device: 64 MiB
CASES = {
    "numpy pmean, out_axes=None": "numpy-pmean",
    "numpy psum, out_axes=None": "numpy-psum",
    "JAX front end psum (threads), out_axes=None": "jax-psum",
    "JAX front end psum (vectorized), out_axes=None": "jax-vectorized-psum",
}


def run_case(case: str) -> dict:
    import spmdsim
    x = np.ones((8, BLOCK), np.float32)
    if case.startswith("numpy"):
        op = spmdsim.lax.pmean if case == "numpy-pmean" else spmdsim.lax.psum
        f = spmdsim.pmap(lambda v: op(v, "i"), "i", out_axes=None)
    else:
        import jax
        import spmdsim.jax as sjax
        f = sjax.pmap(lambda v: jax.lax.psum(v, "i"), "i", out_axes=None,
                      executor="vectorized" if "vectorized" in case else "threads")
    f(x)  # the first call: traces, fills caches
    tracemalloc.start()
    out = f(x)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del out
    return {"input_bytes": x.nbytes, "peak_bytes": peak, "ratio": peak / x.nbytes + 1.0}


def measure_all() -> dict:
    """Every case in its own process; ``ratio`` = (input + peak of the call's own allocations) / input."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"}
    results = {}
    for name, case in CASES.items():
        proc = subprocess.run([sys.executable, "-m", "benchmarks.memory", case], capture_output=True, text=True,
                              env=env, timeout=600)
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else \
            {"error": proc.stderr.strip().splitlines()[-1][:300]}
    return results


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(run_case(sys.argv[1])))
    else:
        for name, r in measure_all().items():
            print(f"{name:50s} " + (f"{r['ratio']:.2f}x the input" if "ratio" in r else r["error"]))
