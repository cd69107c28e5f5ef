"""A flax CNN trained data-parallel with optax: convolutions, cross-device BatchNorm (``axis_name``), max and
average pooling, softmax cross-entropy, SGD with momentum; gradients and loss averaged with ``lax.pmean``."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from _common import finish


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Conv(8, (3, 3), padding="SAME")(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, axis_name="batch")(x)
        x = nn.relu(x)
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.Conv(16, (3, 3), strides=(1, 1), padding="SAME")(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(x)


MODEL = CNN()
OPTIMIZER = optax.sgd(0.05, momentum=0.9)


def loss_fn(params, batch_stats, images, labels):
    logits, updates = MODEL.apply({"params": params, "batch_stats": batch_stats}, images, train=True,
                                  mutable=["batch_stats"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss, updates["batch_stats"]


@functools.partial(jax.pmap, axis_name="batch", in_axes=(None, None, None, 0, 0), out_axes=None)
def train_step(params, batch_stats, opt_state, images, labels):
    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch_stats, images, labels)
    grads, loss = jax.lax.pmean((grads, loss), axis_name="batch")
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), batch_stats, opt_state, loss


def main(steps: int = 4, per_device: int = 4):
    n = jax.local_device_count()
    rng = np.random.default_rng(0)
    images = rng.standard_normal((steps, n, per_device, 12, 12, 1)).astype(np.float32)
    labels = rng.integers(0, 10, (steps, n, per_device)).astype(np.int32)
    variables = MODEL.init(jax.random.PRNGKey(0), jnp.zeros((1, 12, 12, 1)), train=False)
    params, batch_stats = variables["params"], variables["batch_stats"]
    opt_state = OPTIMIZER.init(params)
    losses = []
    for step in range(steps):
        params, batch_stats, opt_state, loss = train_step(params, batch_stats, opt_state, images[step], labels[step])
        losses.append(loss)
        print(f"step {step}  loss {float(loss):.5f}")
    leaves = {f"param_{i}": leaf for i, leaf in enumerate(jax.tree_util.tree_leaves(params))}
    stats = {f"stat_{i}": leaf for i, leaf in enumerate(jax.tree_util.tree_leaves(batch_stats))}
    return finish({"losses": jnp.stack(losses), **leaves, **stats})


if __name__ == "__main__":
    main()
