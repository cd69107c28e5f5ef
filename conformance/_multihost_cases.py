"""Multi-host JAX programs that go wrong, for conformance/test_multihost.py (run by ``spmdsim run --hosts H``,
never imported by pytest): ``python -m spmdsim run --hosts H --devices N _multihost_cases.py CASE``.

- ``mismatch``: the devices of host 1 call ``pmax`` where every other device calls ``psum``.
- ``deadlock``: the last device skips the ``psum`` (a ``cond`` on its axis index).
- ``raising``: the last device raises (in a ``jax.debug.callback``, on its concrete value).
- ``killed``: host 1 kills itself (SIGKILL) while the others wait for it in a mapped call; it first prints
  ``killing at <time.time()>``, and each other host prints ``host H lost a host at <time.time()>`` when the
  HostLostError reaches its program.
- ``late``: host 1's program ends after one mapped call; the others make a second.
- ``sleeping``: host 1 sleeps a minute before its second mapped call (for Ctrl-C); host 0 prints ``waiting``;
  each host prints ``host H interrupted at <time.time()>`` when the KeyboardInterrupt reaches its program.
- ``initialize``: ``jax.distributed.initialize`` with a process count that is not the run's.
- ``gone``: host 1 ends before any mapped call; host 2 (of 3) reaches the first one after host 0 has.
- ``submesh``: a shard_map over the first two devices only.
- ``transforms``: ``jax.jit`` and ``jax.grad`` around a pmap across hosts; prints each host's results.
"""
import os
import signal
import sys
import time

import jax
import numpy as np

from spmdsim.errors import HostLostError

case = sys.argv[1]
host, local, n = jax.process_index(), jax.local_device_count(), jax.device_count()
x = np.arange(local, dtype=np.float32) + 10 * host


def psum(v):
    return jax.lax.psum(v, "i")


def check(v):
    if int(v) == n - 1:
        raise ValueError(f"device {int(v)} found a bad value")


if case == "mismatch":
    f = jax.pmap(lambda v: jax.lax.pmax(v, "i") if host == 1 else psum(v), "i")
elif case == "deadlock":
    f = jax.pmap(lambda v: jax.lax.cond(jax.lax.axis_index("i") < n - 1, psum, lambda u: u, v), "i")
elif case == "raising":
    def f_raising(v):
        jax.debug.callback(check, jax.lax.axis_index("i"))
        return psum(v)
    f = jax.pmap(f_raising, "i")
elif case == "gone":
    if host == 1:
        sys.exit(0)
    if host == 2:
        time.sleep(1.0)
    f = jax.pmap(psum, "i")
elif case == "submesh":
    mesh = jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:2])
    f = jax.shard_map(psum, mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P())
    x = np.ones(2, np.float32)
elif case == "transforms":
    f = jax.jit(jax.pmap(lambda v: psum(v) + jax.lax.axis_index("i"), "i"))
    g = jax.grad(lambda v: jax.pmap(lambda u: psum(u * u), "i")(v).sum())
    print(f"host {host}: {np.asarray(f(x)).tolist()} {np.asarray(g(x)).tolist()}")
    sys.exit(0)
elif case == "initialize":
    jax.distributed.initialize(coordinator_address="127.0.0.1:1234", num_processes=jax.process_count() + 1)
else:
    f = jax.pmap(psum, "i")

out = f(x)
if case == "killed" and host == 1:
    print(f"killing at {time.time()}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
if case == "late" and host == 1:
    sys.exit(0)
try:
    if case == "sleeping":
        if host == 1:
            time.sleep(60)
        else:
            print("waiting", flush=True)
    out = f(out)
except KeyboardInterrupt:
    print(f"host {host} interrupted at {time.time()}", flush=True)
    raise
except HostLostError:
    print(f"host {host} lost a host at {time.time()}", flush=True)
    raise
print(f"host {host}: {np.asarray(out).tolist()}")
