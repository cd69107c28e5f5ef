"""A second-order step on the hyperparameters of a Gaussian process, data-parallel: each device holds a chunk
of the data; the negative log marginal likelihood of each chunk (Cholesky factor, triangular solves), its
gradient and its Hessian are summed over devices with ``lax.psum``; the Newton step uses an eigendecomposition
of the Hessian (``eigh``) to stay a descent direction."""
import functools

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax

from _common import finish


def neg_log_marginal(log_params, x, y):
    length, amplitude, noise = jnp.exp(log_params)
    sq = jnp.sum((x[:, None, :] - x[None, :, :]) ** 2, axis=-1)
    k = amplitude * jnp.exp(-0.5 * sq / length ** 2) + (noise + 1e-4) * jnp.eye(x.shape[0])
    chol = jnp.linalg.cholesky(k)
    alpha = jsl.cho_solve((chol, True), y)
    return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(chol))) + 0.5 * y.shape[0] * jnp.log(2 * jnp.pi)


def predictive_mean(log_params, x, y, x_new):
    length, amplitude, noise = jnp.exp(log_params)
    kernel = lambda a, b: amplitude * jnp.exp(-0.5 * jnp.sum((a[:, None] - b[None]) ** 2, -1) / length ** 2)  # noqa
    chol = jnp.linalg.cholesky(kernel(x, x) + (noise + 1e-4) * jnp.eye(x.shape[0]))
    v = jsl.solve_triangular(chol, y, lower=True)
    w = jsl.solve_triangular(chol.T, v, lower=False)
    return kernel(x_new, x) @ w


@functools.partial(jax.pmap, axis_name="data", in_axes=(None, 0, 0, None), out_axes=(None, None, 0))
def newton_step(log_params, x, y, x_new):
    loss, grad = jax.value_and_grad(neg_log_marginal)(log_params, x, y)
    hess = jax.hessian(neg_log_marginal)(log_params, x, y)
    loss, grad, hess = lax.psum((loss, grad, hess), axis_name="data")
    eigenvalues, eigenvectors = jnp.linalg.eigh(hess)
    step = eigenvectors @ ((eigenvectors.T @ grad) / jnp.maximum(jnp.abs(eigenvalues), 1e-2))
    return log_params - 0.5 * step, loss, predictive_mean(log_params, x, y, x_new)


def main(steps: int = 3, per_device: int = 12):
    n = jax.local_device_count()
    rng = np.random.default_rng(1)
    x = rng.uniform(-3, 3, (n, per_device, 2)).astype(np.float32)
    y = (np.sin(x[..., 0]) * np.cos(x[..., 1]) + 0.1 * rng.standard_normal((n, per_device))).astype(np.float32)
    x_new = np.linspace(-2, 2, 10, dtype=np.float32).reshape(5, 2)
    log_params = jnp.zeros(3, jnp.float32)
    losses = []
    for step in range(steps):
        log_params, loss, mean = newton_step(log_params, x, y, x_new)
        losses.append(loss)
        print(f"step {step}  negative log marginal likelihood {float(loss):.4f}")
    return finish({"log_params": log_params, "losses": jnp.stack(losses), "predictive_mean": mean})


if __name__ == "__main__":
    main()
