"""A bfloat16 mixed-precision training step: float32 master weights, a bfloat16 forward and backward pass (an
MLP with GELU and softmax cross-entropy), bfloat16 gradients averaged over devices with ``lax.pmean``, the update
in float32."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from _common import finish


def init(key, sizes=(16, 32, 4)):
    keys = jax.random.split(key, len(sizes) - 1)
    return [{"w": jax.random.normal(k, (a, b), jnp.float32) / np.sqrt(a), "b": jnp.zeros(b, jnp.float32)}
            for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def loss_fn(params_bf16, x, y):
    h = x.astype(jnp.bfloat16)
    for layer in params_bf16[:-1]:
        h = jax.nn.gelu(h @ layer["w"] + layer["b"])
    logits = (h @ params_bf16[-1]["w"] + params_bf16[-1]["b"]).astype(jnp.float32)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, logits.shape[-1]), axis=-1))


@functools.partial(jax.pmap, axis_name="batch", in_axes=(None, 0, 0), out_axes=None)
def train_step(params, x, y):
    params_bf16 = jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16), params)
    loss, grads = jax.value_and_grad(loss_fn)(params_bf16, x, y)
    grads = lax.pmean(grads, axis_name="batch")                    # bfloat16 all-reduce
    loss = lax.pmean(loss, axis_name="batch")
    new = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g.astype(jnp.float32), params, grads)
    return new, loss


def main(steps: int = 5, per_device: int = 8):
    n = jax.local_device_count()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, per_device, 16)).astype(np.float32)
    y = rng.integers(0, 4, (n, per_device)).astype(np.int32)
    params = init(jax.random.PRNGKey(0))
    losses = []
    for step in range(steps):
        params, loss = train_step(params, x, y)
        losses.append(loss)
        print(f"step {step}  loss {float(loss):.4f}")
    leaves = {f"param_{i}": leaf for i, leaf in enumerate(jax.tree_util.tree_leaves(params))}
    return finish({"losses": jnp.stack(losses), **leaves})


if __name__ == "__main__":
    main()
