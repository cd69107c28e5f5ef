"""An equinox model trained with eqx.filter_pmap (in_axes given as a pytree of the model's structure, which
jax.pmap must accept as a prefix) and eqx.filter_value_and_grad; gradients averaged with pmean."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from _common import finish


def main(steps: int = 10):
    n = jax.local_device_count()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 8, 2)).astype(np.float32)
    y = (x[..., 0] * x[..., 1]).astype(np.float32)[..., None]
    model = eqx.nn.MLP(2, 1, width_size=8, depth=2, key=jax.random.key(1))

    @eqx.filter_pmap(axis_name="batch", in_axes=(None, 0, 0), out_axes=None)
    def step(model, xb, yb):
        def loss_fn(m):
            return jnp.mean((jax.vmap(m)(xb) - yb) ** 2)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        grads = lax.pmean(grads, "batch")
        model = eqx.apply_updates(model, jax.tree_util.tree_map(lambda g: -0.05 * g, grads))
        return model, lax.pmean(loss, "batch")

    losses = []
    for _ in range(steps):
        model, loss = step(model, x, y)
        losses.append(loss)
    return finish({"losses": jnp.stack(losses), "first_weight": model.layers[0].weight})


if __name__ == "__main__":
    main()
