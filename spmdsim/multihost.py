"""``jax.experimental.multihost_utils`` for spmdsim's hosts: data moved between hosts by spmdsim collectives.

Each function is, as in JAX, a ``shard_map`` over the global mesh ``('processes', 'local_devices')`` (one row
per host) whose input is each host's value: so it is a step of the hosts' sequence like any mapped call (a host
that skips it is reported, with the line), and the data go through spmdsim's rendezvous. With one host they
return at once, as JAX's do. ``spmdsim run --hosts`` puts them in place of JAX's.

Values are NumPy arrays (anything ``np.asarray`` takes) in spmdsim's pytrees; the results are NumPy arrays.
"""
from __future__ import annotations

import zlib

import numpy as np

from spmdsim.runtime import _hosts, _tree

from spmdsim import lax
from spmdsim.frontend._shard_map import P, make_mesh, shard_map

__all__ = ["process_allgather", "broadcast_one_to_all", "sync_global_devices", "assert_equal"]


def _over_hosts(body, leaves: list[np.ndarray]) -> list[np.ndarray]:
    """``body`` on every host's leaves (each with a leading axis of 1 added: the host's row), replicated out."""
    host = _hosts.current()
    mesh = make_mesh((host.count, host.local), ("processes", "local_devices"))
    f = shard_map(lambda *blocks: [body(b) for b in blocks], mesh=mesh, in_specs=P("processes"), out_specs=P())
    return f(*[x[None] for x in leaves])


def process_allgather(in_tree, tiled: bool = False):
    """Every host's ``in_tree``, gathered on every host (``jax.experimental.multihost_utils.process_allgather``).

    Args:
      in_tree: a pytree of arrays; each leaf must have the same shape and dtype on every host.
      tiled: False: stack the hosts' leaves on a new axis 0, shape ``(process_count(), *shape)``; True:
        concatenate them along axis 0 (a scalar leaf is stacked either way, but returned as it is with one
        host, as in JAX).

    Returns: the pytree of NumPy arrays, identical on every host.

    Raises: CollectiveMismatchError when the hosts' shapes or dtypes differ (naming each host's devices and
    lines); CollectiveDeadlockError when some host does not call it.
    """
    leaves, treedef = _tree.flatten(in_tree)
    arrays = [np.asarray(x) for x in leaves]
    if _hosts.process_count() == 1:  # as JAX: the leaves as they are (tiled), or with a leading axis of 1
        return _tree.unflatten(treedef, [a if tiled else a[None] for a in arrays])
    arrays = [a if tiled and a.ndim else a[None] for a in arrays]
    out = _over_hosts(lambda b: lax.all_gather(b[0], "processes", tiled=True), arrays)
    return _tree.unflatten(treedef, [np.asarray(o) for o in out])


def broadcast_one_to_all(in_tree, is_source: bool | None = None):
    """Host 0's ``in_tree`` (or the source's) on every host (``multihost_utils.broadcast_one_to_all``): the sum
    over hosts of the source's leaves and every other host's zeros, as JAX computes it.

    Args:
      in_tree: a pytree of arrays, of the same shapes and dtypes on every host.
      is_source: whether this host contributes its data (default: ``process_index() == 0``).

    Returns: the pytree of NumPy arrays (dtypes kept; bool leaves are or-ed).
    """
    leaves, treedef = _tree.flatten(in_tree)
    arrays = [np.asarray(x) for x in leaves]
    if _hosts.process_count() == 1:
        return _tree.unflatten(treedef, arrays)
    if is_source is None:
        is_source = _hosts.process_index() == 0
    sent = [(a if is_source else np.zeros_like(a)) for a in arrays]
    sent = [a.astype(np.int32) if a.dtype == np.bool_ else a for a in sent]
    out = _over_hosts(lambda b: lax.psum(b[0], "processes"), sent)
    return _tree.unflatten(treedef, [np.asarray(o).astype(a.dtype) for o, a in zip(out, arrays, strict=True)])


def assert_equal(in_tree, fail_message: str = "") -> None:
    """Check that every host passed the same ``in_tree`` (``multihost_utils.assert_equal``).

    Raises: AssertionError on every host when they differ, with ``fail_message``, JAX's text, and the hosts
    whose values differ from host 0's.
    """
    out = process_allgather(in_tree, tiled=False)
    count = _hosts.process_count()
    differ = set()
    for x, gathered in zip(_tree.flatten(in_tree)[0], _tree.flatten(out)[0], strict=True):
        x = np.asarray(x)
        equal = [np.array_equal(gathered[h], gathered[0]) for h in range(count)]
        differ |= {h for h, same in enumerate(equal) if not same}
        if not np.array_equal(gathered[_hosts.process_index()], x):
            differ.add(_hosts.process_index())
    if differ:
        raise AssertionError(f"{fail_message}. Expected: {out}; got: {in_tree}. (spmdsim: host"
                             f"{'s' if len(differ) > 1 else ''} {', '.join(map(str, sorted(differ)))} "
                             f"passed values that differ from host 0's.)")


def sync_global_devices(name: str) -> None:
    """A barrier over every host (``multihost_utils.sync_global_devices``): returns when all hosts reached a call
    with the same ``name``. AssertionError when the names differ; a host that never calls it is a
    CollectiveDeadlockError naming it."""
    h = np.uint32(zlib.crc32(name.encode()))
    assert_equal(h, f"sync_global_devices name mismatch ('{name}')")
