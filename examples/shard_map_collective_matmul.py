"""Collective matmuls with spmdsim.shard_map: the blocks of a sharded matmul travel around a ring with
lax.ppermute over the mesh axis 'i' (8 devices) instead of one all_gather or psum_scatter. Both variants are
checked against the plain product x @ w.

The NumPy-front-end twin of examples/jax/shard_map_collective_matmul.py (the same functions with numpy for
jax.numpy), against the planned API of issue 12 (``spmdsim.shard_map``, ``spmdsim.make_mesh``, ``spmdsim.P``;
it cannot run before those exist). Under spmdsim every ppermute is a rendezvous of the 8 device threads:
``spmdsim.trace()`` shows the ring step by step.

* all-gather matmul: x sharded by rows, w by rows (the contraction dimension); the w blocks go around the
  ring, each device multiplies the block it holds by the matching columns of its rows of x.
* reduce-scatter matmul: x sharded by columns, w by rows; an accumulator per block of rows goes around the
  ring and every device adds its partial product's slab.
"""
import numpy as np

import spmdsim
from spmdsim import P, lax

AXIS = "i"


def allgather_matmul(x_rows, w_rows):
    """x_rows: (m, K) this device's rows of x; w_rows: (k, N) its rows of w, k = K / n."""
    n, idx = lax.axis_size(AXIS), lax.axis_index(AXIS)
    k = w_rows.shape[0]
    x_cols = x_rows.reshape(x_rows.shape[0], n, k)          # x_cols[:, j] multiplies w's block j
    to_left = [(j, (j - 1) % n) for j in range(n)]          # device j sends to j - 1
    acc = np.zeros((x_rows.shape[0], w_rows.shape[1]), x_rows.dtype)
    w_block = w_rows
    for step in range(n):
        held = (idx + step) % n                            # the w block this device holds now
        acc = acc + x_cols[:, held] @ w_block
        if step < n - 1:
            w_block = lax.ppermute(w_block, AXIS, to_left)
    return acc


def reducescatter_matmul(x_cols, w_rows):
    """x_cols: (M, k) this device's columns of x; w_rows: (k, N) the matching rows of w."""
    n, idx = lax.axis_size(AXIS), lax.axis_index(AXIS)
    partial = (x_cols @ w_rows).reshape(n, -1, w_rows.shape[1])   # (n, M / n, N): one slab per row block
    to_left = [(j, (j - 1) % n) for j in range(n)]
    acc = np.zeros(partial.shape[1:], partial.dtype)
    for step in range(n):
        acc = acc + partial[(idx + step + 1) % n]          # ends on device d holding row block d
        if step < n - 1:
            acc = lax.ppermute(acc, AXIS, to_left)
    return acc


def main(m: int = 64, k: int = 32, n_out: int = 16):
    mesh = spmdsim.make_mesh((8,), (AXIS,))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n_out)).astype(np.float32)
    expected = x @ w

    ag = spmdsim.shard_map(allgather_matmul, mesh=mesh, in_specs=(P(AXIS), P(AXIS)), out_specs=P(AXIS),
                           check_vma=True)
    rs = spmdsim.shard_map(reducescatter_matmul, mesh=mesh, in_specs=(P(None, AXIS), P(AXIS)),
                           out_specs=P(AXIS), check_vma=True)
    with spmdsim.trace() as tr:
        y_ag = ag(x, w)
        y_rs = rs(x, w)
    for name, y in [("all-gather matmul", y_ag), ("reduce-scatter matmul", y_rs)]:
        err = float(np.max(np.abs(y - expected)))
        print(f"{name}: {y.shape}, max |y - x @ w| = {err:.2e}, "
              f"matches: {np.allclose(y, expected, rtol=1e-5, atol=1e-5)}")
    print("collectives run:", dict(sorted(tr.counts().items())))   # 7 ppermutes per matmul, nothing else
    return {"allgather_matmul": y_ag, "reducescatter_matmul": y_rs, "expected": expected}


if __name__ == "__main__":
    main()
