"""What ``spmdsim run`` changes in JAX for the duration of a script.

- ``jax.pmap`` becomes :func:`spmdsim.jax.pmap` (so ``from jax import pmap`` in the script gets it too).
- ``jax.shard_map`` (and the legacy ``jax.experimental.shard_map.shard_map``) builds functions that JAX
  traces and spmdsim runs (:mod:`spmdsim.jax._shard_map`), and ``jax.jit`` evaluates a jitted program that
  contains a map with spmdsim (the parts outside the maps once, on global values); other jitted functions are
  JAX's.
- JAX's CPU platform gets as many devices as spmdsim has virtual devices (``jax_num_cpu_devices``, set before
  JAX's backend starts), so ``jax.devices()``, ``jax.local_devices()``, ``jax.device_count()`` and
  ``jax.local_device_count()`` agree with spmdsim, and the devices are real JAX devices: ``jax.device_put``,
  ``jax.sharding.Mesh``, ``jax.make_mesh`` and ``flax.jax_utils.replicate`` accept them. They only *hold*
  arrays; every value of a mapped function is computed by spmdsim.
"""
from __future__ import annotations

import contextlib
import functools
import sys

import spmdsim

__all__ = ["patched_jax", "use_cpu_devices"]


def use_cpu_devices(n: int) -> bool:
    """Give JAX ``n`` CPU devices (and make the CPU its platform) if its backend has not started yet. Returns
    whether JAX now has ``n`` devices; when the backend already started with another count, says so on
    stderr (spmdsim still simulates ``n`` devices; only ``jax.devices()`` reports the others)."""
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", n)
    if jax.device_count() == n:
        return True
    print(f"spmdsim: JAX's backend started before spmdsim could give it {n} CPU devices; jax.devices() reports "
          f"{jax.device_count()}. spmdsim simulates {n} devices regardless. To make them agree, set "
          f"jax.config.update('jax_num_cpu_devices', {n}) before JAX is first used.", file=sys.stderr)
    return False


@contextlib.contextmanager
def patched_jax(n_devices: int, executor: str = "threads"):
    """For the block: ``jax.pmap`` is :func:`spmdsim.jax.pmap` (with ``executor``), spmdsim has ``n_devices``
    virtual devices, and so has JAX's CPU platform (see :func:`use_cpu_devices`)."""
    import jax

    import spmdsim.jax as sjax

    from jax._src import shard_map as jax_shard_map

    from spmdsim.jax import _shard_map

    use_cpu_devices(n_devices)
    pmap = sjax.pmap if executor == "threads" else functools.wraps(sjax.pmap)(
        functools.partial(sjax.pmap, executor=executor))
    build = jax_shard_map._shard_map

    @functools.wraps(build)
    def shard_map(f, **kwargs):
        return _shard_map.simulated(build(f, **kwargs), executor)

    replaced = [(jax, "pmap", pmap), (jax, "jit", _shard_map.jit), (jax_shard_map, "_shard_map", shard_map)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
    from spmdsim import _devices

    with spmdsim.set_device_count(n_devices), _devices.devices_hint("--devices {n} (spmdsim run's option)"):
        for owner, name, value in replaced:
            setattr(owner, name, value)
        try:
            yield
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
