"""spmdsim: a pure-NumPy reference simulator of JAX's SPMD programming model (``pmap``, ``shard_map``).

``spmdsim.pmap`` and ``spmdsim.shard_map`` run a function once per virtual device, each in its own thread on
concrete NumPy blocks; the collectives in ``spmdsim.lax`` are barrier-synchronised rendezvous over named axes.
The API mirrors ``jax.pmap``/``jax.shard_map``/``jax.vmap``/``jax.lax`` so code ports by changing an import.
"""
from spmdsim import debug, errors, lax, show
from spmdsim.primitives._reduction import ReductionOrder, current_reduction_order, set_reduction_order
from spmdsim.runtime._output import set_ordered_output
from spmdsim.runtime._devices import VirtualDevice, device_count, devices, local_device_count, set_device_count
from spmdsim.runtime._hosts import local_devices, process_count, process_index
from spmdsim.frontend._pmap import pmap, vmap
from spmdsim.frontend._shard_map import Mesh, P, PartitionSpec, make_mesh, shard_map
from spmdsim.runtime._threads import reuse_threads
from spmdsim.tools._trace import trace
from spmdsim.runtime._tree import register_pytree_node
from spmdsim.hosts import run_hosts
from spmdsim.errors import (CollectiveDeadlockError, CollectiveError, CollectiveMismatchError, HostLostError,
                            ReplicationError, SpmdSimError)

__version__ = "0.1.0"

__all__ = ["pmap", "vmap", "shard_map", "Mesh", "make_mesh", "PartitionSpec", "P", "reuse_threads", "lax", "trace", "debug", "show", "register_pytree_node", "devices",
           "device_count", "local_device_count", "set_device_count", "local_devices", "process_index", "process_count",
           "run_hosts", "VirtualDevice", "set_reduction_order",
           "set_ordered_output", "current_reduction_order", "ReductionOrder", "errors", "SpmdSimError",
           "CollectiveError", "CollectiveMismatchError", "CollectiveDeadlockError", "ReplicationError", "HostLostError"]
