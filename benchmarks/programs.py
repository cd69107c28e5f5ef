"""The benchmarked programs, written once for each side: NumPy front end, JAX (both spmdsim.jax and jax.pmap)."""
import numpy as np

CHAIN = 100          # psums chained inside one mapped call (latency)
BIG = 4 * 1024 * 1024  # float32 elements per block: 16 MiB


def numpy_chain(lax):
    def f(x):
        for _ in range(CHAIN):
            x = lax.psum(x, "i") * np.float32(0.125)
        return x
    return f


def jax_chain(lax):
    def f(x):
        for _ in range(CHAIN):
            x = lax.psum(x, "i") * 0.125
        return x
    return f


def numpy_train_step(lax):
    def step(params, x, y):
        w, b = params
        err = x @ w + b - y
        loss = np.mean(err * err)
        grads = (2.0 * x.T @ err / len(y), 2.0 * np.mean(err))
        loss, grads = lax.pmean((loss, grads), "i")
        return tuple(p - np.float32(0.1) * g for p, g in zip(params, grads)), loss
    return step


def jax_train_step(jax):
    import jax.numpy as jnp

    def loss_fn(params, x, y):
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        loss, grads = jax.lax.pmean((loss, grads), "i")
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss
    return step


def train_data(n, per_device=64, features=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, per_device, features)).astype(np.float32)
    y = rng.standard_normal((n, per_device)).astype(np.float32)
    return x, y


def jax_loss(jax):
    """The per-device loss of the training step, pmapped with in_axes=(None, 0, 0): its grad is taken
    outside the pmap (the "grad" benchmark)."""
    import jax.numpy as jnp

    def loss(params, x, y):
        return jax.lax.pmean(jnp.mean((x @ params["w"] + params["b"] - y) ** 2), "i")
    return loss


def grad_of_pmap(jax, pmap):
    """``jax.grad`` of the summed pmapped loss with respect to the replicated parameters."""
    losses = pmap(jax_loss(jax), "i", in_axes=(None, 0, 0))
    return jax.grad(lambda params, x, y: losses(params, x, y).sum())


def jit_of_pmap(jax, pmap):
    """``jax.jit(jax.pmap(step))`` of the training step."""
    return jax.jit(pmap(jax_train_step(jax), "i", in_axes=(None, 0, 0), out_axes=None))


STEPS = 1000  # steps of the "many small calls" training loop


def training_loop(step, params, x, y, steps: int = STEPS, block=lambda value: value):
    """``steps`` calls of the mapped training ``step``, each on the previous step's parameters (what a user's
    loop does); returns the last loss. ``block(loss)`` after each step (jax.pmap: jax.block_until_ready)."""
    loss = None
    for _ in range(steps):
        params, loss = step(params, x, y)
        block(loss)
    return loss
