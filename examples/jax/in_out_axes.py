"""in_axes / out_axes with a replicated scalar in JAX (seed pattern 001), one block per device."""
import jax
import jax.numpy as jnp
from jax import pmap

from _common import finish


def scale(x, k):
    return x * k


def main():
    n = jax.local_device_count()
    data = jnp.arange(n * 2 * 3, dtype=jnp.float32).reshape(n, 2, 3)
    stacked = pmap(scale, in_axes=(0, None), out_axes=0)(data, jnp.float32(10.0))
    moved = pmap(scale, in_axes=(0, None), out_axes=1)(data, jnp.float32(10.0))
    both = pmap(lambda x, k: (x * k, k), in_axes=(0, None), out_axes=(0, None))(data, jnp.float32(3.0))
    return finish({"stacked": stacked, "moved": moved, "both0": both[0], "both1": both[1]})


if __name__ == "__main__":
    main()
