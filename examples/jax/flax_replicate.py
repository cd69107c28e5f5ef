"""A flax + optax data-parallel training loop in the classic pmap style: a linen MLP, its TrainState
replicated on every device with flax.jax_utils.replicate, jax.pmap'd step with pmean of the gradients,
unreplicate at the end. Unmodified: under `spmdsim run` every value of the step is computed by spmdsim."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import jax_utils
from flax.training import train_state
from jax import lax

from _common import finish


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.tanh(nn.Dense(16)(x))
        return nn.Dense(1)(x)[..., 0]


@functools.partial(jax.pmap, axis_name="batch")
def train_step(state, x, y):
    def loss_fn(params):
        return jnp.mean((state.apply_fn({"params": params}, x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    grads = lax.pmean(grads, "batch")
    return state.apply_gradients(grads=grads), lax.pmean(loss, "batch")


def main(steps: int = 20):
    n = jax.local_device_count()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 8, 3)).astype(np.float32)
    y = np.sin(x.sum(-1)).astype(np.float32)
    model = MLP()
    params = model.init(jax.random.key(0), x[0])["params"]
    state = jax_utils.replicate(train_state.TrainState.create(apply_fn=model.apply, params=params,
                                                              tx=optax.adam(1e-2)))
    losses = []
    for _ in range(steps):
        state, loss = train_step(state, x, y)
        losses.append(loss[0])
    final = jax_utils.unreplicate(state)
    return finish({"losses": jnp.stack(losses), "kernel": final.params["Dense_0"]["kernel"],
                   "devices": np.array([len(jax.local_devices()), jax.device_count()])})


if __name__ == "__main__":
    main()
