"""Data-parallel training with spmdsim.shard_map: linear regression on the diabetes table (442 patients x 10
features, standardized), the rows sharded over a one-axis mesh 'batch', the parameters replicated.

The NumPy-front-end twin of examples/jax/shard_map_data_parallel.py, line for line, against the planned API
(issue 12: ``spmdsim.shard_map``, ``spmdsim.make_mesh``, ``spmdsim.P``; it cannot run before those exist).
The differences from the JAX version are the NumPy front end's: gradients are written by hand (no
autodiff), so the pmean of the loss and of the gradients is explicit; inputs are plain NumPy arrays (no
device_put); no jit.

Each device gets 56 rows (6 padding rows with weight 0) and scales its sums by N / 442, so the pmean is
exactly the full-batch mean. The result is compared with numpy.linalg.lstsq.
"""
import os

import numpy as np

import spmdsim
from spmdsim import P, lax

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spmdsim", "data", "diabetes.csv")


def load_diabetes():
    table = np.loadtxt(DATA, delimiter=",", skiprows=1)
    x, y = table[:, :-1], table[:, -1]
    standardize = lambda a: (a - a.mean(axis=0)) / a.std(axis=0)
    return standardize(x).astype(np.float32), standardize(y).astype(np.float32)


def pad_rows(x, y, n_devices):
    """Pad to a multiple of the device count; the mask is 1 on real rows, 0 on padding."""
    rows = len(x)
    pad = -rows % n_devices
    mask = np.concatenate([np.ones(rows), np.zeros(pad)]).astype(np.float32)
    return np.pad(x, ((0, pad), (0, 0))), np.pad(y, (0, pad)), mask


def local_loss_and_grads(params, x, y, mask, scale):
    err = (x @ params["w"] + params["b"] - y) * mask
    loss = scale * 0.5 * np.sum(err * err)
    grads = {"w": scale * (x.T @ err), "b": scale * np.sum(err)}
    return loss, grads


def make_train_step(mesh, scale, lr=0.1, momentum=0.95):
    def step(params, velocity, x, y, mask):
        loss, grads = local_loss_and_grads(params, x, y, mask, scale)
        loss, grads = lax.pmean((loss, grads), "batch")     # by hand: what jax.grad of the pmean'd loss does
        velocity = {k: momentum * velocity[k] - lr * grads[k] for k in velocity}
        params = {k: params[k] + velocity[k] for k in params}
        return params, velocity, loss

    return spmdsim.shard_map(step, mesh=mesh,
                             in_specs=(P(), P(), P("batch"), P("batch"), P("batch")),
                             out_specs=(P(), P(), P()), check_vma=True)


def main(steps: int = 500):
    n = spmdsim.device_count()
    mesh = spmdsim.make_mesh((n,), ("batch",))
    x, y = load_diabetes()
    rows = len(x)
    xp, yp, mask = pad_rows(x, y, n)
    print(f"diabetes: {rows} patients x {x.shape[1]} features; mesh {dict(mesh.shape)}, "
          f"{len(xp) // n} rows per device ({len(xp) - rows} padding rows with weight 0)")

    params = {"w": np.zeros(x.shape[1], np.float32), "b": np.zeros((), np.float32)}
    velocity = {"w": np.zeros(x.shape[1], np.float32), "b": np.zeros((), np.float32)}

    train_step = make_train_step(mesh, scale=np.float32(n / rows))
    losses = []
    with spmdsim.reuse_threads():
        for i in range(1, steps + 1):
            params, velocity, loss = train_step(params, velocity, xp, yp, mask)
            losses.append(float(loss))
            if i == 1 or i % 100 == 0:
                print(f"step {i:4d}  loss {losses[-1]:.6f}")

    reference = np.linalg.lstsq(np.c_[x, np.ones(rows)].astype(np.float64), y.astype(np.float64), rcond=None)[0]
    learned = np.r_[params["w"], params["b"][None]]
    print(f"lstsq gap: {np.max(np.abs(learned - reference)):.2e}")
    return {"w": params["w"], "b": params["b"], "losses": np.array(losses, np.float32), "reference": reference}


if __name__ == "__main__":
    main()
