"""What ``spmdsim run`` changes in JAX for the duration of a script: ``jax.pmap`` becomes
:func:`spmdsim.jax.pmap`, and the device queries report the virtual devices."""
from __future__ import annotations

import contextlib

import spmdsim

REPLACED = ("pmap", "device_count", "local_device_count", "devices")


@contextlib.contextmanager
def patched_jax(n_devices: int, executor: str = "threads"):
    """Replace jax.pmap (by spmdsim.jax.pmap with ``executor``) and the device queries for the block; the
    device threads are reused between calls (``spmdsim.reuse_threads()``) until the block ends."""
    import functools

    import jax

    import spmdsim.jax as sjax

    saved = {name: getattr(jax, name) for name in REPLACED}
    pmap = sjax.pmap if executor == "threads" else functools.wraps(sjax.pmap)(
        functools.partial(sjax.pmap, executor=executor))
    replacements = {"pmap": pmap, "device_count": spmdsim.device_count,
                    "local_device_count": spmdsim.local_device_count,
                    "devices": lambda backend=None: spmdsim.devices(backend)}
    with spmdsim.set_device_count(n_devices), spmdsim.reuse_threads():
        for name, value in replacements.items():
            setattr(jax, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(jax, name, value)
