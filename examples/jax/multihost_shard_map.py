"""A multi-host shard_map program, as it runs on a pod: every host loads its own rows of the data by
jax.process_index(), makes the global array with jax.make_array_from_process_local_data, and runs a jitted
shard_map over the global mesh of every host's devices; multihost_utils.process_allgather reads the results.

Under spmdsim (hosts are MPI processes, every value computed by spmdsim):

    spmdsim run --hosts 2 --devices 4 examples/jax/multihost_shard_map.py

Under real JAX, 2 processes on loopback (gloo collectives, 2 CPU devices each):

    JAX_COORDINATOR=127.0.0.1:12345 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=0 python examples/jax/multihost_shard_map.py &
    JAX_COORDINATOR=127.0.0.1:12345 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=1 python examples/jax/multihost_shard_map.py

``--out PREFIX`` writes each host's results to ``PREFIX.<host>.npz``.
"""
import os
import sys

import jax
import numpy as np

try:  # real JAX: 2 CPU devices per process (spmdsim run gives each host its devices itself)
    jax.config.update("jax_num_cpu_devices", int(os.environ.get("JAX_LOCAL_DEVICES", "2")))
except RuntimeError:
    pass
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if "JAX_COORDINATOR" in os.environ:
    process_id = os.environ.get("JAX_PROCESS_ID")  # unset under spmdsim run: each host knows its index
    jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR"],
                               num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=None if process_id is None else int(process_id))

from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402


def main() -> dict:
    host, local = jax.process_index(), jax.local_device_count()
    mesh = jax.make_mesh((jax.process_count(), local), ("hosts", "devices"), axis_types=(AxisType.Auto,) * 2)
    rows = np.arange(4 * local * 3, dtype=np.float32).reshape(4 * local, 3) / 7 + host  # this host's rows
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P(("hosts", "devices"))), rows)

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=P(("hosts", "devices")), out_specs=(P(), P(("hosts", "devices")), P("hosts")))
    def step(block):
        total = jax.lax.psum(block.sum(0), ("hosts", "devices"))
        centred = block - total / (4 * jax.device_count())
        per_host = jax.lax.psum(block.sum(0, keepdims=True), "devices")
        return total, centred * jax.lax.axis_index("devices"), per_host

    total, centred, per_host = step(x)
    return {"shape": np.array(x.shape), "total": np.asarray(total),
            "centred": multihost_utils.process_allgather(centred, tiled=True),
            "per_host": multihost_utils.process_allgather(per_host, tiled=True),
            "host_rows": multihost_utils.process_allgather(rows[:2])}


if __name__ == "__main__":
    results = main()
    print(f"host {jax.process_index()}: global {tuple(results['shape'].tolist())}, total {results['total'].round(3).tolist()}")
    if "--out" in sys.argv:
        np.savez(f"{sys.argv[sys.argv.index('--out') + 1]}.{jax.process_index()}.npz", **results)
