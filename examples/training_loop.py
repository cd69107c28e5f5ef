"""A synchronous data-parallel training loop (seed pattern 003): linear regression y = X w + b.

Each device computes the mean-squared-error gradient on its shard, ``pmean`` averages the gradients over
the axis 'batch', every device applies the same update; the parameters stay replicated (in_axes=None on
the way in, out_axes=None on the way out). Gradients are written by hand: this is the NumPy front end.

Replicating parameters with ``pmap(lambda x: x, in_axes=None)`` (as a seed page does) is rejected by JAX
and by spmdsim: a pmap needs at least one mapped argument. Pass them with in_axes=None instead.
"""
import numpy as np

import spmdsim
from spmdsim import lax


def loss_and_grads(params, x, y):
    w, b = params
    err = x @ w + b - y
    loss = np.mean(err ** 2)
    grads = (2.0 * x.T @ err / len(y), 2.0 * np.mean(err))
    return loss, grads


def train_step(params, x, y, lr):
    loss, grads = loss_and_grads(params, x, y)
    loss, grads = lax.pmean((loss, grads), axis_name="batch")
    new_params = tuple(p - lr * g for p, g in zip(params, grads))
    return new_params, loss


def main(n_devices: int = 8, samples_per_device: int = 100, features: int = 5, steps: int = 200,
         lr: float = 0.1, seed: int = 0):
    rng = np.random.default_rng(seed)
    true_w, true_b = rng.standard_normal(features), rng.standard_normal()
    x = rng.standard_normal((n_devices * samples_per_device, features))
    y = x @ true_w + true_b + 0.1 * rng.standard_normal(len(x))
    xs = x.reshape(n_devices, samples_per_device, features)
    ys = y.reshape(n_devices, samples_per_device)
    step = spmdsim.pmap(train_step, axis_name="batch", in_axes=(None, 0, 0, None), out_axes=None,
                        check_replicated=True)
    params = (np.zeros(features), np.zeros(()))
    losses = []
    for i in range(steps):
        params, loss = step(params, xs, ys, lr)
        losses.append(float(loss))
        if i % 50 == 0 or i == steps - 1:
            print(f"step {i:3d}  loss {losses[-1]:.5f}")
    print("learned w:", np.round(params[0], 3), " true w:", np.round(true_w, 3))
    return params, (true_w, true_b), losses, (x, y)


if __name__ == "__main__":
    main()
