"""Per-device signal processing and sampling: the power spectrum of each device's signal (``jnp.fft.rfft``),
its frequencies binned with ``jnp.searchsorted``, band powers summed over devices (``lax.psum``), a low-pass
filter by ``irfft``, ``jnp.interp`` and ``jnp.digitize``, and gamma-distributed draws (``jax.random.gamma``,
each device with its own key) whose shapes come from the spectrum."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from _common import finish

EDGES = np.linspace(0.0, 0.5, 5, dtype=np.float32)


@functools.partial(jax.pmap, axis_name="i")
def analyse(key, signal):
    spectrum = jnp.fft.rfft(signal)
    power = jnp.abs(spectrum) ** 2
    freqs = jnp.fft.rfftfreq(signal.shape[0]).astype(jnp.float32)
    bands = jnp.searchsorted(EDGES, freqs, side="right")
    band_power = jax.ops.segment_sum(power, bands, num_segments=len(EDGES) + 1)
    total = lax.psum(band_power, axis_name="i")
    low_pass = jnp.fft.irfft(jnp.where(freqs < 0.15, spectrum, 0), n=signal.shape[0])
    resampled = jnp.interp(jnp.linspace(0.0, 1.0, 7), jnp.linspace(0.0, 1.0, signal.shape[0]), low_pass)
    levels = jnp.digitize(low_pass, jnp.array([-0.5, 0.0, 0.5]))
    shapes = 0.5 + 4.0 * band_power[1:4] / (jnp.sum(band_power) + 1e-6)
    draws = jax.random.gamma(key, shapes, shape=(256, 3))
    return total, low_pass, resampled, levels, draws.mean(axis=0), jnp.sort(draws[:8, 0])


def main():
    n = jax.local_device_count()
    rng = np.random.default_rng(2)
    t = np.arange(64, dtype=np.float32)
    signals = (np.sin(2 * np.pi * (0.05 + 0.02 * np.arange(n))[:, None] * t) + 0.3 * rng.standard_normal((n, 64))
               ).astype(np.float32)
    keys = jax.random.split(jax.random.PRNGKey(7), n)
    total, low_pass, resampled, levels, means, first = analyse(keys, signals)
    print("band power (summed over devices):", np.asarray(total[0]))
    return finish({"band_power": total, "low_pass": low_pass, "resampled": resampled, "levels": levels,
                   "gamma_means": means, "gamma_first": first})


if __name__ == "__main__":
    main()
