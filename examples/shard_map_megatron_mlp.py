"""2-D data x model parallelism with spmdsim.shard_map: a Megatron-style MLP on a (4, 2) mesh
('data', 'model').

    y = relu(x @ W1 + b1) @ W2 + b2

The NumPy-front-end twin of examples/jax/shard_map_megatron_mlp.py (same data, same layout, same steps),
against the planned API of issue 12 (``spmdsim.shard_map``, ``spmdsim.make_mesh``, ``spmdsim.P``; it cannot
run before those exist).

* x's rows are split over 'data'; W1 by columns and b1 over 'model'; W2 by rows over 'model'; b2 replicated.
* Forward: each model shard computes its slice of the hidden units, multiplies it by its rows of W2, and
  one psum over 'model' completes y.
* Backward, by hand (the NumPy front end has no autodiff): dy needs no communication (y is complete on
  every model shard); dh = dy @ W2_shard.T is this shard's slice of the hidden gradient, again without
  communication; every parameter gradient is then a sum over the batch, so one psum over 'data' each. In the
  JAX version jax.grad inserts exactly these psums (check_vma=True: a parameter replicated over 'data' gets
  its gradient summed over 'data').
"""
import numpy as np

import spmdsim
from spmdsim import P, lax

SPECS = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model"), "b2": P()}


def sgd_step(params, x, t, lr=0.05):
    # forward
    z1 = x @ params["w1"] + params["b1"]
    h = np.maximum(z1, 0)                                     # this shard's hidden units
    y = lax.psum(h @ params["w2"], "model") + params["b2"]    # partial sums over the hidden units
    n_data = lax.axis_size("data")
    loss = lax.pmean(np.mean((y - t) ** 2), "data")
    # backward: d loss / d y for this device's rows (pmean: divided by the number of 'data' shards)
    dy = 2 * (y - t) / (y.size * n_data)
    dh = dy @ params["w2"].T
    dz1 = dh * (z1 > 0)
    grads = {"w1": x.T @ dz1, "b1": dz1.sum(axis=0), "w2": h.T @ dy, "b2": dy.sum(axis=0)}
    grads = lax.psum(grads, "data")                           # sums over the batch
    return {k: params[k] - lr * grads[k] for k in params}, loss


def reference_step(params, x, t, lr=0.05):
    """The same step on one device, no sharding."""
    z1 = x @ params["w1"] + params["b1"]
    h = np.maximum(z1, 0)
    y = h @ params["w2"] + params["b2"]
    loss = np.mean((y - t) ** 2)
    dy = 2 * (y - t) / y.size
    dz1 = (dy @ params["w2"].T) * (z1 > 0)
    grads = {"w1": x.T @ dz1, "b1": dz1.sum(axis=0), "w2": h.T @ dy, "b2": dy.sum(axis=0)}
    return {k: params[k] - lr * grads[k] for k in params}, loss


def make_problem(batch, d_in, hidden, d_out, seed=0):
    """A teacher network's targets and a random student (the same numbers as the JAX version)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, d_in)).astype(np.float32)
    t = np.tanh(x @ rng.standard_normal((d_in, d_out))).astype(np.float32)
    params = {"w1": (rng.standard_normal((d_in, hidden)) / np.sqrt(d_in)).astype(np.float32),
              "b1": np.zeros(hidden, np.float32),
              "w2": (rng.standard_normal((hidden, d_out)) / np.sqrt(hidden)).astype(np.float32),
              "b2": np.zeros(d_out, np.float32)}
    return x, t, params


def main(steps: int = 20, batch: int = 32, d_in: int = 8, hidden: int = 16, d_out: int = 4):
    mesh = spmdsim.make_mesh((4, 2), ("data", "model"))
    x, t, params = make_problem(batch, d_in, hidden, d_out)

    step = spmdsim.shard_map(sgd_step, mesh=mesh, in_specs=(SPECS, P("data"), P("data")),
                             out_specs=(SPECS, P()), check_vma=True)
    losses, sharded, ref_params = [], params, params
    with spmdsim.reuse_threads():
        for i in range(steps):
            sharded, loss = step(sharded, x, t)
            ref_params, ref_loss = reference_step(ref_params, x, t)
            losses.append(float(loss))
            if i % 5 == 0 or i == steps - 1:
                print(f"step {i:3d}  loss {float(loss):.6f}  (one device: {float(ref_loss):.6f})")
    gap = max(float(np.max(np.abs(sharded[k] - ref_params[k]))) for k in params)
    print(f"largest parameter difference from the one-device run after {steps} steps: {gap:.2e}")
    return {**sharded, "losses": np.array(losses, np.float32), "gap": np.float32(gap)}


if __name__ == "__main__":
    main()
