"""2-D data x model parallelism with jax.shard_map: a Megatron-style MLP on a (4, 2) mesh ('data', 'model').

    y = relu(x @ W1 + b1) @ W2 + b2

* The batch rows are split over 'data' (P('data')): 4 groups of devices see different rows.
* W1 is split by COLUMNS over 'model' (P(None, 'model')), b1 with it: each model shard computes its own
  slice of the hidden units, with no communication.
* W2 is split by ROWS over 'model' (P('model')): each model shard multiplies its hidden slice by its rows
  of W2, which gives a partial sum of y; one psum over 'model' completes it. b2 is replicated.
* The loss is the mean over the whole batch: pmean over 'data'. Its gradient, taken inside shard_map, is
  already complete for every parameter (check_vma=True sums the gradient of a value that is replicated over
  'data' across 'data'), so the update needs no further collective.

The sharded training steps are checked against the same steps on one device (plain jnp).
"""
import jax
import jax.numpy as jnp
import numpy as np
from _common import finish, request_cpu_devices
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

request_cpu_devices(8)

SPECS = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model"), "b2": P()}


def mlp(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])        # this shard's hidden units
    return lax.psum(h @ params["w2"], "model") + params["b2"]  # partial sums over the hidden units


def loss_fn(params, x, t):
    return lax.pmean(jnp.mean((mlp(params, x) - t) ** 2), "data")


def sgd_step(params, x, t, lr=0.05):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, t)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


def reference_step(params, x, t, lr=0.05):
    """The same step on one device, no sharding."""
    def loss(p):
        y = jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return jnp.mean((y - t) ** 2)
    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), value


def make_problem(batch, d_in, hidden, d_out, seed=0):
    """A teacher network's targets and a random student (NumPy's generator, so that the NumPy-front-end twin
    examples/shard_map_megatron_mlp.py starts from the same numbers)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, d_in)).astype(np.float32)
    t = np.tanh(x @ rng.standard_normal((d_in, d_out))).astype(np.float32)
    params = {"w1": (rng.standard_normal((d_in, hidden)) / np.sqrt(d_in)).astype(np.float32),
              "b1": np.zeros(hidden, np.float32),
              "w2": (rng.standard_normal((hidden, d_out)) / np.sqrt(hidden)).astype(np.float32),
              "b2": np.zeros(d_out, np.float32)}
    return x, t, params


def main(steps: int = 20, batch: int = 32, d_in: int = 8, hidden: int = 16, d_out: int = 4):
    mesh = jax.make_mesh((4, 2), ("data", "model"))          # Explicit axes
    x, t, params = make_problem(batch, d_in, hidden, d_out)

    place = lambda tree, specs: jax.tree_util.tree_map(
        lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs)
    sharded = place(params, SPECS)
    xs, ts = place((x, t), (P("data"), P("data")))
    print("w1 block per device:", sharded["w1"].addressable_shards[0].data.shape,
          " w2 block:", sharded["w2"].addressable_shards[0].data.shape,
          " x block:", xs.addressable_shards[0].data.shape)

    step = jax.jit(jax.shard_map(sgd_step, mesh=mesh, in_specs=(SPECS, P("data"), P("data")),
                                 out_specs=(SPECS, P())))
    reference = jax.jit(reference_step)
    losses, ref_params = [], params
    for i in range(steps):
        sharded, loss = step(sharded, xs, ts)
        ref_params, ref_loss = reference(ref_params, x, t)
        losses.append(loss.block_until_ready())
        if i % 5 == 0 or i == steps - 1:
            print(f"step {i:3d}  loss {float(loss):.6f}  (one device: {float(ref_loss):.6f})")
    gap = max(float(jnp.max(jnp.abs(sharded[k] - ref_params[k]))) for k in params)
    print(f"largest parameter difference from the one-device run after {steps} steps: {gap:.2e}")
    return finish({"w1": sharded["w1"], "b1": sharded["b1"], "w2": sharded["w2"], "b2": sharded["b2"],
                   "losses": jnp.stack(losses), "gap": jnp.float32(gap)})


if __name__ == "__main__":
    main()
