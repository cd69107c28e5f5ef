"""A data-parallel training loop in JAX (seed pattern 003): value_and_grad per device, pmean of loss and
gradients over the named axis, a tree_map update, replicated parameters (in_axes=None, out_axes=None)."""
import functools

import jax
import jax.numpy as jnp
from jax import lax

from _common import finish


def loss_fn(params, x, y):
    pred = x @ params["w"] + params["b"]
    return jnp.mean((pred - y) ** 2)


@functools.partial(jax.pmap, axis_name="batch", in_axes=(None, 0, 0), out_axes=None)
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    loss, grads = lax.pmean((loss, grads), axis_name="batch")
    new_params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return new_params, loss


def main(steps: int = 30):
    n = jax.local_device_count()
    kx, kw, kn = jax.random.split(jax.random.PRNGKey(42), 3)
    true_w = jax.random.normal(kw, (5,))
    x = jax.random.normal(kx, (n * 16, 5))
    y = x @ true_w + 0.5 + 0.1 * jax.random.normal(kn, (n * 16,))
    xs, ys = x.reshape(n, 16, 5), y.reshape(n, 16)
    params = {"w": jnp.zeros(5), "b": jnp.zeros(())}
    losses = []
    for step in range(steps):
        params, loss = train_step(params, xs, ys)
        losses.append(loss)
        if step % 10 == 0:
            print(f"step {step:3d}  loss {float(loss):.5f}")
    return finish({"w": params["w"], "b": params["b"], "losses": jnp.stack(losses)})


if __name__ == "__main__":
    main()
