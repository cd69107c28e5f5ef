"""Collective matmuls with jax.shard_map: overlap the communication of a sharded matmul with its compute by
passing blocks around a ring with lax.ppermute over the mesh axis 'i' (8 devices), instead of one
all_gather or psum_scatter. Both are checked against the plain product x @ w.

* all-gather matmul: x sharded by rows, w by rows (the contraction dimension). Each device needs all of w;
  the w blocks travel around the ring, and at every step a device multiplies the block it holds by the
  matching columns of its rows of x. Result: x @ w sharded by rows.
* reduce-scatter matmul: x sharded by columns, w by rows. Every device's product is a full-size partial sum;
  an accumulator for each block of rows travels around the ring and every device adds its part. Result:
  x @ w sharded by rows, without ever materializing a full partial product's reduction in one place.

The mesh is built by hand from the device list (``jax.sharding.Mesh``), so its axis is Auto and plain
arrays can be passed in.
"""
import jax
import jax.numpy as jnp
import numpy as np
from _common import finish, request_cpu_devices
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

request_cpu_devices(8)

AXIS = "i"


def allgather_matmul(x_rows, w_rows):
    """x_rows: (m, K) this device's rows of x; w_rows: (k, N) its rows of w, k = K / n."""
    n, idx = lax.axis_size(AXIS), lax.axis_index(AXIS)
    k = w_rows.shape[0]
    x_cols = x_rows.reshape(x_rows.shape[0], n, k)          # x_cols[:, j] multiplies w's block j
    to_left = [(j, (j - 1) % n) for j in range(n)]          # device j sends to j - 1
    acc = jnp.zeros((x_rows.shape[0], w_rows.shape[1]), x_rows.dtype)
    w_block = w_rows
    for step in range(n):
        held = (idx + step) % n                            # the w block this device holds now
        acc = acc + x_cols[:, held] @ w_block
        if step < n - 1:
            w_block = lax.ppermute(w_block, AXIS, to_left)  # on hardware: overlaps the next product
    return acc


def reducescatter_matmul(x_cols, w_rows):
    """x_cols: (M, k) this device's columns of x; w_rows: (k, N) the matching rows of w."""
    n, idx = lax.axis_size(AXIS), lax.axis_index(AXIS)
    partial = (x_cols @ w_rows).reshape(n, -1, w_rows.shape[1])   # (n, M / n, N): one slab per row block
    to_left = [(j, (j - 1) % n) for j in range(n)]
    acc = jnp.zeros(partial.shape[1:], partial.dtype)
    for step in range(n):
        acc = acc + partial[(idx + step + 1) % n]          # ends on device d holding row block d
        if step < n - 1:
            acc = lax.ppermute(acc, AXIS, to_left)
    return acc


def main(m: int = 64, k: int = 32, n_out: int = 16):
    mesh = Mesh(np.array(jax.devices()[:8]), (AXIS,))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n_out)).astype(np.float32)
    expected = x @ w

    ag = jax.jit(jax.shard_map(allgather_matmul, mesh=mesh, in_specs=(P(AXIS), P(AXIS)), out_specs=P(AXIS)))
    rs = jax.jit(jax.shard_map(reducescatter_matmul, mesh=mesh, in_specs=(P(None, AXIS), P(AXIS)),
                               out_specs=P(AXIS)))
    y_ag = ag(x, w).block_until_ready()
    y_rs = rs(x, w).block_until_ready()
    for name, y in [("all-gather matmul", y_ag), ("reduce-scatter matmul", y_rs)]:
        err = float(np.max(np.abs(np.asarray(y) - expected)))
        print(f"{name}: {y.shape}, sharding {y.sharding.spec}, max |y - x @ w| = {err:.2e}, "
              f"matches: {np.allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5)}")
    jaxpr = str(jax.make_jaxpr(ag)(x, w))
    print(f"the all-gather matmul's jaxpr: {jaxpr.count(' ppermute[')} ppermutes, "
          f"{jaxpr.count(' all_gather[')} all_gathers")
    return finish({"allgather_matmul": y_ag, "reducescatter_matmul": y_rs, "expected": expected})


if __name__ == "__main__":
    main()
