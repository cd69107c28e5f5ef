"""Which host this code runs on, as the front ends ask it: the questions JAX's ``xla_bridge`` answers
(``process_index``, ``process_count``, ``local_devices``) and the part of a global mesh a host's data covers.

The answers come from the process group in force (:mod:`spmdsim.runtime._process_group`); a multi-host run installs
one (:mod:`spmdsim.hosts`, which describes the model: hosts, global devices, one global call per mapped call).
This module knows no host implementation, as ``xla_bridge`` does not know ``jax.distributed``'s client.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from spmdsim.runtime import _process_group
from spmdsim.runtime._devices import local_devices

__all__ = ["current", "layout", "process_index", "process_count", "local_devices", "local_mesh", "host_box"]


def current():
    """The process group this code runs in when it is a multi-host run's host (a
    :class:`~spmdsim.runtime._process_group.ProcessGroup` of several processes), else None."""
    group = _process_group.current()
    return None if group is _process_group.SINGLE_PROCESS else group


layout = _process_group.layout  # ``(H, L)``: the host count and local device count, or None with one host


def process_index() -> int:
    """This host's index, ``0 <= process_index() < process_count()`` (``jax.process_index()``); 0 with one host."""
    return _process_group.current().index


def process_count() -> int:
    """The number of hosts (``jax.process_count()``); 1 outside a multi-host run."""
    return _process_group.current().count


def local_mesh(axes: Sequence[tuple[Any, int]], what: str = "the mesh") -> tuple:
    """This host's part of a global mesh ``axes`` ((name, size) pairs, row-major over the global devices): the
    same names with the extents its devices cover, ``L`` devices in all. Process-local data is laid out over this
    box exactly as global data over the mesh (JAX's ``make_array_from_process_local_data``).

    Raises ValueError when the mesh does not span every host's devices, or a host's devices do not form a box of
    the mesh (then process-local data would not be an array)."""
    axes = tuple(axes)
    host = current()
    if host is None:
        return axes
    total = math.prod(s for _, s in axes)
    if total != host.count * host.local:
        raise ValueError(f"{what} has {total} devices, but a multi-host call spans every host's devices: "
                         f"{host.count} hosts x {host.local} local devices = {host.count * host.local}. Build it "
                         f"from spmdsim.devices() (all of them).")
    return host_box(axes, host.local, what)


def host_box(axes: Sequence[tuple[Any, int]], per_host: int, what: str = "the mesh") -> tuple:
    """The box of the mesh ``axes`` that a run of ``per_host`` consecutive devices (row-major) covers, the same
    for every host: its axes with their extents. ValueError when such a run is not a box."""
    sizes = [s for _, s in axes]
    extents, inner = [1] * len(sizes), 1
    for k in range(len(sizes) - 1, -1, -1):
        if per_host % (inner * sizes[k]) == 0:
            extents[k], inner = sizes[k], inner * sizes[k]
            continue
        if per_host % inner or sizes[k] % (per_host // inner):
            raise ValueError(f"{what} ({', '.join(f'{n}={s}' for n, s in axes)}) does not give each host a box of "
                             f"devices: a host's {per_host} devices are not a block of the mesh, so its "
                             f"process-local data would not be an array. Reorder the mesh axes so that the "
                             f"leading axis runs over hosts.")
        extents[k], inner = per_host // inner, per_host
        break
    return tuple((name, e) for (name, _), e in zip(axes, extents, strict=True))
