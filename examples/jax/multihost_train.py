"""A multi-host data-parallel training loop, as it runs on a pod: every host runs this script, loads its own shard
of the data by jax.process_index(), and passes pmap arrays whose mapped axis is its local device count; the pmean
of the gradients spans every device of every host. multihost_utils checks and gathers across hosts at the end.

Under spmdsim, hosts are MPI processes (every value computed by spmdsim):

    spmdsim run --hosts 2 --devices 4 examples/jax/multihost_train.py

Under real JAX, the same script in 2 processes on loopback (gloo collectives, 2 CPU devices each):

    JAX_COORDINATOR=127.0.0.1:12345 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=0 python examples/jax/multihost_train.py &
    JAX_COORDINATOR=127.0.0.1:12345 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=1 python examples/jax/multihost_train.py

``--out PREFIX`` writes each host's results to ``PREFIX.<host>.npz``.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

try:  # real JAX: 2 CPU devices per process (spmdsim run gives each host its devices itself)
    jax.config.update("jax_num_cpu_devices", int(os.environ.get("JAX_LOCAL_DEVICES", "2")))
except RuntimeError:
    pass
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if "JAX_COORDINATOR" in os.environ:
    process_id = os.environ.get("JAX_PROCESS_ID")
    jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR"],
                               num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=None if process_id is None else int(process_id))

from jax.experimental import multihost_utils  # noqa: E402


def loss_fn(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


def step(w, x, y):
    loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
    return w - 0.1 * jax.lax.pmean(grad, "batch"), jax.lax.pmean(loss, "batch")


def main(steps: int = 5) -> dict:
    hosts, host, local = jax.process_count(), jax.process_index(), jax.local_device_count()
    rows = 8 * local  # per host
    rng = np.random.default_rng(0)
    x_all = rng.standard_normal((hosts * rows, 3)).astype(np.float32)
    y_all = (x_all @ np.array([1.0, -2.0, 0.5], np.float32) + 0.1).astype(np.float32)
    x = x_all[host * rows:(host + 1) * rows].reshape(local, 8, 3)  # this host's shard
    y = y_all[host * rows:(host + 1) * rows].reshape(local, 8)
    p_step = jax.pmap(step, axis_name="batch", in_axes=(None, 0, 0), out_axes=(None, None))
    w, losses = jnp.zeros(3, jnp.float32), []
    for _ in range(steps):
        w, loss = p_step(w, x, y)
        losses.append(np.asarray(loss))
    multihost_utils.assert_equal(np.asarray(w), "the hosts' weights differ")
    multihost_utils.sync_global_devices("trained")
    return {"w": np.asarray(w), "losses": np.array(losses),
            "gathered": multihost_utils.process_allgather(np.asarray(w)),
            "hosts_first_rows": multihost_utils.process_allgather(x[0, 0]),
            "from_host_0": multihost_utils.broadcast_one_to_all(np.float32(host + 7))}


if __name__ == "__main__":
    results = main()
    print(f"host {jax.process_index()} of {jax.process_count()} ({jax.local_device_count()} of "
          f"{jax.device_count()} devices): loss {results['losses'][0]:.4f} -> {results['losses'][-1]:.4f}")
    if "--out" in sys.argv:
        np.savez(f"{sys.argv[sys.argv.index('--out') + 1]}.{jax.process_index()}.npz", **results)
