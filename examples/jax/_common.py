"""Shared by the JAX examples: `--out FILE.npz` saves what main() returned, so runs can be compared.

One step at a time: on a machine with few cores (2 here), XLA:CPU with 8 forced devices can deadlock when a
loop dispatches programs containing collectives back to back without waiting for the previous result (its
all-reduce rendezvous waits for a device thread that never comes, and after 40 s the process aborts). The
training loops therefore wait for each step's result (``block_until_ready``).
"""
import sys

import numpy as np


def finish(results: dict) -> dict:
    for name, value in results.items():
        print(f"{name}: {np.asarray(value).shape} {np.asarray(value).dtype}")
    if "--out" in sys.argv:
        np.savez(sys.argv[sys.argv.index("--out") + 1], **{k: np.asarray(v) for k, v in results.items()})
    return results


def request_cpu_devices(n: int = 8) -> None:
    """Run standalone (``python examples/jax/NAME.py``), ask XLA for ``n`` CPU devices. This must happen
    before JAX's first operation; when JAX is already running (under pytest or ``spmdsim run``, which
    provide the devices) it changes nothing."""
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        pass
