"""The psum of benchmarks/hosts.py: one script, run under ``spmdsim run --devices 8 --hosts H`` and under real
JAX as H processes (``jax.distributed.initialize``, gloo on loopback; ``JAX_LOCAL_DEVICES`` CPU devices each).
Every call is one step of every host; host 0 prints its timings as JSON."""
import json
import os
import sys

import jax
import numpy as np

try:  # real JAX (spmdsim run gives each host its devices itself)
    jax.config.update("jax_num_cpu_devices", int(os.environ.get("JAX_LOCAL_DEVICES", "8")))
except RuntimeError:
    pass
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if "JAX_COORDINATOR" in os.environ:
    process_id = os.environ.get("JAX_PROCESS_ID")
    jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR"],
                               num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=None if process_id is None else int(process_id))

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import measure  # noqa: E402

f = jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")
x = np.ones((jax.local_device_count(), 4), np.float32)
# A fixed number of calls (min_time=0): a number each host chose by its own clock would differ between hosts,
# a deadlock (spmdsim reports it; real JAX hangs).
result = measure(lambda: jax.block_until_ready(f(x)), int(os.environ.get("REPEATS", "200")), min_time=0)
assert np.asarray(f(x))[0, 0] == jax.device_count()
if jax.process_index() == 0:
    print(json.dumps({"processes": jax.process_count(), "devices": jax.device_count(), **result}), flush=True)
