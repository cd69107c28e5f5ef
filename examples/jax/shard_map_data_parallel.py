"""Data-parallel training with jax.shard_map: linear regression on the diabetes table (442 patients x 10
features, standardized), the rows sharded over a one-axis mesh 'batch', the parameters replicated.

The shard_map version of examples/jax/training_loop.py (which uses pmap). Three things differ from pmap:

* ``jax.make_mesh`` gives Explicit axes by default, so the inputs must already carry the sharding the
  in_specs name: ``jax.device_put(x, NamedSharding(mesh, P('batch')))`` (a plain array is rejected with
  "in_specs passed to shard_map: P('batch', None) does not match the specs of the input: P(None, None)").
* The gradient is taken of the pmean'd loss. Under check_vma=True (the default) the gradient of a
  replicated parameter is already summed over the devices, so the pmap idiom "grad, then pmean" would give
  N times the gradient here.
* ``out_specs=P()`` claims the outputs are replicated; check_vma verifies it from the types.

442 rows do not divide by 8: every device gets 56 rows, the 6 padding rows have weight 0, and each device
scales its sum by N / 442, so the pmean is exactly the full-batch mean. The result is compared with
numpy.linalg.lstsq.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
from _common import finish, request_cpu_devices
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

request_cpu_devices(8)

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "spmdsim", "data", "diabetes.csv")


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


def local_loss(params, x, y, mask, scale):
    err = (x @ params["w"] + params["b"] - y) * mask
    return scale * 0.5 * jnp.sum(err * err)


def make_train_step(mesh, scale, lr=0.1, momentum=0.95):
    def step(params, velocity, x, y, mask):
        # grad of the pmean'd loss: right under check_vma=True (the parameters are replicated, P())
        loss, grads = jax.value_and_grad(lambda p: lax.pmean(local_loss(p, x, y, mask, scale), "batch"))(params)
        velocity = jax.tree_util.tree_map(lambda v, g: momentum * v - lr * g, velocity, grads)
        params = jax.tree_util.tree_map(lambda p, v: p + v, params, velocity)
        return params, velocity, loss

    return jax.jit(jax.shard_map(step, mesh=mesh,
                                 in_specs=(P(), P(), P("batch"), P("batch"), P("batch")),
                                 out_specs=(P(), P(), P())))


def main(steps: int = 500):
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("batch",))                  # Explicit axes (JAX 0.10's default)
    x, y = load_diabetes()
    rows = len(x)
    xp, yp, mask = pad_rows(x, y, n)
    print(f"diabetes: {rows} patients x {x.shape[1]} features; mesh {dict(mesh.shape)}, "
          f"{len(xp) // n} rows per device ({len(xp) - rows} padding rows with weight 0)")

    rows_sharded = NamedSharding(mesh, P("batch"))
    replicated = NamedSharding(mesh, P())
    xs, ys, ms = (jax.device_put(a, rows_sharded) for a in (xp, yp, mask))
    params = jax.device_put({"w": jnp.zeros(x.shape[1]), "b": jnp.zeros(())}, replicated)
    velocity = jax.device_put({"w": jnp.zeros(x.shape[1]), "b": jnp.zeros(())}, replicated)

    train_step = make_train_step(mesh, scale=n / rows)
    losses = []
    for i in range(1, steps + 1):
        params, velocity, loss = train_step(params, velocity, xs, ys, ms)
        losses.append(loss.block_until_ready())   # one step at a time (see the note in _common.py)
        if i == 1 or i % 100 == 0:
            print(f"step {i:4d}  loss {float(loss):.6f}")

    reference = np.linalg.lstsq(np.c_[x, np.ones(rows)].astype(np.float64), y.astype(np.float64), rcond=None)[0]
    learned = np.r_[np.asarray(params["w"]), np.asarray(params["b"])[None]]
    print(f"lstsq gap: {np.max(np.abs(learned - reference)):.2e}")
    print("parameters' sharding:", params["w"].sharding.spec, "(replicated)")
    return finish({"w": params["w"], "b": params["b"], "losses": jnp.stack(losses), "reference": reference})


if __name__ == "__main__":
    main()
