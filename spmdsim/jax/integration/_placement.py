"""Where JAX puts what spmdsim computed: the shardings of a map's outputs, and of a jitted program's.

A map's outputs are the ``jax.Array``s JAX hands back (:func:`map_out_shardings`): a shard_map's on its mesh by
its out_spec, a pmap's on ``Mesh(devices[:n], (axis_name,))`` (JAX 0.10 builds pmap as a jit of a shard_map over
that mesh), in a multi-host run this host's part (:func:`local_mesh`). A jitted program that contains maps
places its outputs on its maps' mesh (:func:`program_shardings`). ``spmdsim.jax.integration._map`` (each map's outputs),
``._api`` (pmap's remembered calls) and ``._shard_map`` (jitted programs) use it; it uses none of them.
"""
from __future__ import annotations

import functools
import math

import jax
from spmdsim.jax._internals import mesh_lib
from spmdsim.jax._internals import weakref_lru_cache
from jax.extend import core as ext_core
from jax.sharding import AxisType

from spmdsim.runtime import _hosts, _runtime
from spmdsim.runtime._axes import Unnamed

__all__ = ["PMAP_AXIS", "local_mesh", "map_mesh", "map_out_shardings", "program_shardings"]


def local_mesh(axes: tuple) -> tuple:
    """This host's box of a top-level map's mesh in a multi-host run (its process-local data are laid over it;
    see :func:`spmdsim.runtime._hosts.local_mesh`); the mesh itself otherwise, and for a mesh that does not span every
    host's devices (a map nested in a body)."""
    found = _hosts.layout()
    if found is None or math.prod(size for _, size in axes) != found[0] * found[1]:
        return axes
    return _hosts.local_mesh(axes, "the map's mesh")


PMAP_AXIS = "_internal_pmap_axis_name"  # the mesh axis name of a jax.pmap without axis_name (JAX 0.10)


def map_out_shardings(params: dict, args=()) -> tuple:
    """Where JAX puts each output of a map (``spmdsim_map``'s ``params``, called on ``args``): a shard_map's on
    its mesh by its out_spec; a pmap's on the mesh of its devices (JAX 0.10's pmap is a jit of a shard_map over
    ``Mesh(devices[:n], (axis_name,))``; in a multi-host run, this host's part of it). None, ``jnp.asarray``'s
    placement, for a map inside a mapped body and where JAX has no such devices (a mesh larger than JAX's CPU
    platform, an AbstractMesh that neither the context nor an argument makes concrete)."""
    if _runtime.current_lane() is not None:
        return (None,) * len(params["out_specs"])
    return _named_shardings(_map_mesh(params, args), params["out_specs"])


def map_mesh(params: dict, args=()):
    """The concrete ``jax.sharding.Mesh`` a map runs on (a pmap's: JAX's devices; a shard_map's: its own, or for
    an AbstractMesh the context's or an argument's of its shape), or None."""
    return _map_mesh(params, args)


def _map_mesh(params: dict, args=()):
    """The concrete ``jax.sharding.Mesh`` a map runs on (see :func:`map_out_shardings`), or None."""
    if params["api"] == "shard_map":
        mesh = params["mesh"]
        if mesh is None or isinstance(mesh, jax.sharding.Mesh):
            return mesh
        return _concrete_mesh(mesh, _context_mesh(), _argument_meshes(args))
    axes = params["axes"]
    (name, n), = axes
    local = local_mesh(axes)[0][1]
    host = _hosts.current() if local != n else None  # a multi-host pmap: this host's devices
    return _pmap_mesh(PMAP_AXIS if isinstance(name, Unnamed) else name, local,
                      0 if host is None else host.devices.start, params.get("devices"))


@functools.lru_cache(maxsize=256)
def _pmap_mesh(name, count: int, start: int, devices):
    """``Mesh(devices[start:start + count], (name,))`` (``devices``: JAX's unless the pmap names them), or None
    where there are not that many."""
    chosen = (tuple(jax.devices()) if devices is None else tuple(devices))[start:start + count]
    if len(chosen) < count:
        return None
    try:
        return jax.sharding.Mesh(chosen, (name,))
    except Exception:  # noqa: BLE001 - an axis name JAX's Mesh does not take: no placement
        return None


@functools.lru_cache(maxsize=1024)
def _named_shardings(mesh, out_specs: tuple) -> tuple:
    """``NamedSharding(mesh, spec)`` per output (spmdsim's per-dimension specs; pmap's unnamed axis as JAX names
    it), or Nones without a mesh."""
    if mesh is None:
        return (None,) * len(out_specs)
    from spmdsim.jax.evaluation._unreduced import partition_spec
    return tuple(jax.sharding.NamedSharding(mesh, partition_spec(
        dims, lambda name: PMAP_AXIS if isinstance(name, Unnamed) else name)) for dims in out_specs)


def _context_mesh():
    """The concrete mesh of ``jax.set_mesh``, or None."""
    mesh = mesh_lib.get_concrete_mesh()
    return None if mesh is None or mesh.empty else mesh


def _argument_meshes(args) -> tuple:
    """The concrete meshes of the arguments' shardings, in order, each once."""
    found = []
    for x in args:
        mesh = getattr(getattr(x, "sharding", None), "mesh", None) if isinstance(x, jax.Array) else None
        if isinstance(mesh, jax.sharding.Mesh) and mesh not in found:
            found.append(mesh)
    return tuple(found)


def _same_shape(a, b) -> bool:
    return tuple(a.axis_names) == tuple(b.axis_names) and tuple(a.axis_sizes) == tuple(b.axis_sizes)


def _concrete_mesh(mesh, context, argument_meshes: tuple):
    """The concrete mesh a shard_map over ``mesh`` runs on: itself; for an ``AbstractMesh`` (a shard_map
    without ``mesh=`` under ``jax.set_mesh``) the context mesh of its shape, else an argument's (where JAX finds
    it); None if none."""
    if mesh is None or isinstance(mesh, jax.sharding.Mesh):
        return mesh
    return next((m for m in (context, *argument_meshes) if m is not None and _same_shape(m, mesh)), None)


class _Forwarded:
    """A program output that is one of its inputs: JAX hands back a new array with the input's sharding when
    the input is committed to the program's mesh, else on that mesh, replicated (``otherwise``)."""

    def __init__(self, index: int, mesh, otherwise):
        self.index, self.mesh, self.otherwise = index, mesh, otherwise

    def sharding(self, args):
        x = args[self.index]
        if isinstance(x, jax.Array) and x.committed and getattr(x.sharding, "mesh", None) == self.mesh:
            return x.sharding
        return self.otherwise


def program_shardings(jaxpr, args) -> list:
    """Where JAX puts each output of a jitted program that contains maps (see :func:`_placement`), for this
    call's arguments; worked out once per program, context mesh and host."""
    if _runtime.current_lane() is not None:
        return [None] * len(jaxpr.outvars)
    host = _hosts.current()
    context = _context_mesh()
    typed = _jitted(jaxpr)
    rules, unresolved = _placement(jaxpr, context, None if host is None else host.index, None, typed)
    if unresolved:  # a shard_map over an AbstractMesh that the context does not make concrete
        rules, _ = _placement(jaxpr, context, None if host is None else host.index, _argument_meshes(args), typed)
    return [rule.sharding(args) if isinstance(rule, _Forwarded) else rule for rule in rules]


def _jitted(jaxpr) -> bool:
    """Whether ``jaxpr`` is a jitted function's program (not an eager shard_map's, which ``spmdsim.jax``'s
    shard_map traces as ``flat_fun``): JAX places a jit's outputs by their types, with every dimension in the
    spec (``P(None,)``, ``P(None, unreduced={'x'})``), an eager shard_map's by its out_specs as written."""
    return getattr(getattr(jaxpr, "debug_info", None), "func_name", None) != "flat_fun"


@weakref_lru_cache
def _placement(jaxpr, context, host, argument_meshes, typed: bool = False) -> tuple[list, bool]:
    """Each output's sharding as JAX gives it (or a :class:`_Forwarded`), and whether a map's mesh is unknown
    without the arguments' (``argument_meshes`` None: not looked at). A jitted program runs on the devices of
    its maps' meshes (the first met): a map's output has the map's out_spec on its mesh (also through a jit;
    ``typed``: in a jitted program, the sharding its Explicit-axes type names, where it names one),
    an input handed back keeps its placement there, a value whose type names an Explicit sharding has it on
    the concrete mesh of that shape, and anything else is replicated over the mesh (XLA's sharding
    propagation may split some of these in JAX); None where no mesh is known (``jnp.asarray``'s placement)."""
    meshes: list = []
    unresolved: list = []
    produced = _map_outputs(jaxpr, meshes, context, argument_meshes, unresolved)
    mesh = meshes[0] if meshes else None
    otherwise = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()) if mesh is not None else None
    inputs = {v: k for k, v in enumerate(jaxpr.invars)}
    known = [*meshes, *([context] if context is not None else [])]
    rules = []
    for v in jaxpr.outvars:
        if isinstance(v, ext_core.Literal):
            rules.append(otherwise)
        elif v in produced:
            rules.append(_jit_output(produced[v], v.aval, known) if typed else produced[v])
        elif v in inputs:
            rules.append(_Forwarded(inputs[v], mesh, otherwise))
        else:
            rules.append(_typed_sharding(v.aval, known) or otherwise)
    return rules, bool(unresolved) and argument_meshes is None


def _jit_output(sharding, aval, meshes: list):
    """A map's output handed back by a jitted program: the sharding its type names where the map's spec splits
    it over Explicit axes only (a batch axis of ``vmap`` over an Explicit mesh axis shows there), else the map's
    spec with every dimension (:func:`_padded`)."""
    mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if spec is not None and mesh is not None:
        types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", ())))
        named = {n for part in spec.partitions if part is not None
                 for n in (part if isinstance(part, tuple) else (part,))}
        if all(types.get(n) == AxisType.Explicit for n in named):
            typed = _typed_sharding(aval, meshes)
            if typed is not None:
                return typed
    return _padded(sharding, aval) or sharding


def _padded(sharding, aval):
    """A map output's sharding in a jitted program over an Explicit mesh, its spec with every dimension (as JAX's
    jit hands it back: ``P(None, unreduced={'x'})``); None otherwise."""
    mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if spec is None or not any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ())):
        return None
    parts = tuple(spec.partitions)
    if len(parts) >= len(aval.shape):
        return None
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
        *parts, *(None,) * (len(aval.shape) - len(parts)), unreduced=spec.unreduced, reduced=spec.reduced))


def _typed_sharding(aval, meshes: list):
    """The sharding an Explicit-axes type names, on the concrete mesh of its mesh's shape; None otherwise."""
    sharding = getattr(aval, "sharding", None)
    mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if mesh is None or spec is None or not any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ())):
        return None
    concrete = next((m for m in meshes if _same_shape(m, mesh)), None)
    return None if concrete is None else jax.sharding.NamedSharding(concrete, spec)


def _map_outputs(jaxpr, meshes: list, context, argument_meshes, unresolved: list) -> dict:
    """Variables of ``jaxpr`` produced by a map (a shard_map or a pmap, directly or as outputs of a jit around
    one), with their shardings; ``meshes`` collects the concrete meshes of the maps met (also inside control
    flow), ``unresolved`` the maps whose mesh is not known."""
    found: dict = {}
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in ("shard_map", "spmdsim_map"):
            params = eqn.params
            if name == "shard_map" or params["api"] == "shard_map":
                mesh = _concrete_mesh(params["mesh"], context, argument_meshes or ())
            else:  # a pmap
                mesh = _map_mesh(params)
            if mesh is None:
                unresolved.append(eqn)
                continue
            meshes.append(mesh)
            shardings = [jax.sharding.NamedSharding(mesh, spec) for spec in params["out_specs"]] \
                if name == "shard_map" else _named_shardings(mesh, params["out_specs"])  # JAX's specs, or spmdsim's
            found.update(zip(eqn.outvars, shardings, strict=True))
        elif name in ("pjit", "jit", "closed_call", "eval_jaxpr"):
            inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            inner = getattr(inner, "jaxpr", inner)
            inner_found = _map_outputs(inner, meshes, context, argument_meshes, unresolved)
            for v, inner_v in zip(eqn.outvars, inner.outvars, strict=True):
                if not isinstance(inner_v, ext_core.Literal) and inner_v in inner_found:
                    found[v] = inner_found[inner_v]
        else:
            for sub in ext_core.jaxprs_in_params(eqn.params):
                _map_outputs(sub, meshes, context, argument_meshes, unresolved)
    return found
