"""A named psum in JAX (seed pattern 000): psum(2 * [0, 1, ..., n-1]) over the axis 'devices'."""
import jax
import jax.numpy as jnp
from jax import lax

from _common import finish


def scaled_sum(x):
    return lax.psum(x * 2.0, axis_name="devices")


def main():
    n = jax.local_device_count()
    data = jnp.arange(n, dtype=jnp.float32)
    result = jax.pmap(scaled_sum, axis_name="devices")(data)
    print("result (same on every device):", result)
    return finish({"data": data, "result": result})


if __name__ == "__main__":
    main()
