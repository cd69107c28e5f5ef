"""Prediction with broadcast parameters in JAX (seed pattern 002): params in_axes=None, batch sharded."""
import jax
import jax.numpy as jnp

from _common import finish


def predict(params, inputs):
    return jnp.dot(inputs, params["w"]) + params["b"]


def main():
    n = jax.local_device_count()
    key_w, key_b, key_x = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w": jax.random.normal(key_w, (10, 5)), "b": jax.random.normal(key_b, (5,))}
    batch = jax.random.normal(key_x, (n * 4, 10)).reshape(n, 4, 10)
    predictions = jax.pmap(predict, in_axes=(None, 0))(params, batch)
    return finish({"predictions": predictions, "w": params["w"]})


if __name__ == "__main__":
    main()
