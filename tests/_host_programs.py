"""Multi-host NumPy programs: tests/test_hosts.py runs them as spoofed hosts (threads), tests/test_hosts_mpi.py
as MPI processes, and both compare with what the other gives (never imported by pytest as a test module).

``mpiexec -n H python _host_programs.py NAME OUT``: every process runs ``spmdsim.run_hosts(H, PROGRAMS[NAME])``
as one host (SPMDSIM_NUM_DEVICES sets the global device count); host 0 writes what it returned, or the error it
raised (class name and text), to OUT with pickle.
"""
import pickle
import sys

import numpy as np

import spmdsim
from spmdsim import P, lax, multihost

PROGRAMS = {}


def program(fn):
    PROGRAMS[fn.__name__] = fn
    return fn


def dataset(devices: int):
    """A regression problem with 8 rows per device: (x, y) for all devices (one process loads it all)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((devices * 8, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.1).astype(np.float32)
    return x, y


def train(x, y, steps: int = 5):
    """Data-parallel least squares on this host's devices: pmean of the gradients over every device."""
    n = x.shape[0]

    def step(w, xb, yb):
        grad = 2.0 * xb.T @ (xb @ w - yb) / np.float32(len(yb))
        loss = np.mean((xb @ w - yb) ** 2)
        grad, loss = lax.pmean((grad, loss), "batch")
        return w - np.float32(0.1) * grad, loss

    p_step = spmdsim.pmap(step, "batch", in_axes=(None, 0, 0), out_axes=(None, None))
    w, losses = np.zeros(3, np.float32), []
    for _ in range(steps):
        w, loss = p_step(w, x.reshape(n // 8, 8, 3), y.reshape(n // 8, 8))
        losses.append(loss)
    return w, np.array(losses)


@program
def training():
    """Each host loads its own shard of the data by process_index."""
    h, local = spmdsim.process_index(), spmdsim.local_device_count()
    x, y = dataset(spmdsim.device_count())
    shard = slice(h * local * 8, (h + 1) * local * 8)
    return train(x[shard], y[shard])


@program
def allgather():
    h = spmdsim.process_index()
    gathered = multihost.process_allgather({"x": np.arange(3) + 10 * h, "s": np.float32(h)})
    tiled = multihost.process_allgather(np.arange(2.0) + h, tiled=True)
    source = multihost.broadcast_one_to_all(np.array([1.5, 2.5]) * (h + 1))
    multihost.sync_global_devices("the end")
    return gathered, tiled, source


@program
def mesh_psum():
    """shard_map over a global (x, y) mesh, each host passing its rows (process-local data)."""
    n, h, local = spmdsim.device_count(), spmdsim.process_index(), spmdsim.local_device_count()
    mesh = spmdsim.make_mesh((n // 2, 2), ("x", "y"))
    rows = np.arange(n * 4.0).reshape(n, 4)[h * local:(h + 1) * local]
    f = spmdsim.shard_map(lambda b: (lax.psum(b, "x"), lax.all_gather(b, "x", tiled=True),
                                     lax.axis_index(("x", "y"))[None]),
                          mesh=mesh, in_specs=P("x", "y"), out_specs=(P(None, "y"), P(None, "y"), P(("x", "y"))))
    return f(rows)


@program
def printing():
    def f(v):
        print(f"v={float(v)}")
        v = lax.psum(v, "i")
        print(f"sum={float(v)}")
        return v
    return spmdsim.pmap(f, "i")(np.arange(spmdsim.local_device_count()) + 10.0 * spmdsim.process_index())


@program
def mismatch():
    """Host 1's devices call pmax where the others call psum."""
    h = spmdsim.process_index()
    return spmdsim.pmap(lambda v: lax.pmax(v, "i") if h == 1 else lax.psum(v, "i"), "i")(np.ones(spmdsim.local_device_count()))


@program
def subset_deadlock():
    """The last device returns without the psum that every other device waits in."""
    last = spmdsim.device_count() - 1
    return spmdsim.pmap(lambda v: v if lax.axis_index("i") == last else lax.psum(v, "i"), "i")(np.ones(spmdsim.local_device_count()))


@program
def raising():
    """A device of the last host raises."""
    last = spmdsim.device_count() - 1

    def f(v):
        if lax.axis_index("i") == last:
            raise ValueError("bad block on the last device")
        return lax.psum(v, "i")
    return spmdsim.pmap(f, "i")(np.ones(spmdsim.local_device_count()))


@program
def host_finishes_early():
    """Host 1 makes one mapped call fewer than the others."""
    out = spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(np.ones(spmdsim.local_device_count()))
    if spmdsim.process_index() != 1:
        out = spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(out)
    return out


def outcome(name: str, hosts: int):
    """What ``run_hosts(hosts, PROGRAMS[name])`` returns, or ``("error", class name, text)``."""
    try:
        return spmdsim.run_hosts(hosts, PROGRAMS[name])
    except Exception as e:  # noqa: BLE001 - compared by the tests
        return ("error", type(e).__name__, "\n".join([str(e), *getattr(e, "__notes__", ())]))


if __name__ == "__main__":
    from mpi4py import MPI

    name, out = sys.argv[1], sys.argv[2]
    result = outcome(name, MPI.COMM_WORLD.Get_size())
    if spmdsim.process_index() == 0:
        with open(out, "wb") as f:
            pickle.dump(result, f)
