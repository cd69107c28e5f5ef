"""jax.pmap composed with JAX's transformations from the outside: jax.jit(jax.pmap(step)) with a static
argument, the gradient of a pmapped loss taken outside the pmap (grad, value_and_grad, hessian-vector
product), a vmap over a pmap, and a pmap inside lax.fori_loop."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from _common import finish


def per_device_loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def main():
    n = jax.local_device_count()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, 4, 3)).astype(np.float32)
    w = rng.standard_normal((3,)).astype(np.float32)

    losses = jax.pmap(per_device_loss, axis_name="i", in_axes=(None, 0))

    def total(w):
        return losses(w, x).sum()

    @functools.partial(jax.jit, static_argnums=1)
    def jitted_step(w, lr):
        step = jax.pmap(lambda w, x: w - lr * lax.pmean(jax.grad(per_device_loss)(w, x), "i"), "i",
                        in_axes=(None, 0), out_axes=None)
        return step(w, x)

    w_jit = w
    for _ in range(3):
        w_jit = jitted_step(w_jit, 0.1)
    value, grad = jax.value_and_grad(total)(w)
    hvp = jax.jvp(jax.grad(total), (w,), (jnp.ones(3),))[1]
    double = jax.pmap(lambda v: lax.psum(v * v, "i"), "i")
    batched = jax.vmap(double)(np.stack([x[:, 0, 0], x[:, 1, 1]]))
    looped = lax.fori_loop(0, 3, lambda k, v: double(v) / n, x[:, 0, 0])
    return finish({"w_jit": w_jit, "value": value, "grad": grad, "hvp": hvp, "batched": batched, "looped": looped})


if __name__ == "__main__":
    main()
