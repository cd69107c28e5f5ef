"""Differential cases for shard_map: the case type, the ``api`` protocol the cases are written against, the
real-JAX api, and a comparison of any api with real JAX.

A case's ``build(api)`` returns a callable; ``callable(*case.args)`` is the result (a pytree of arrays) or an
exception. The same case runs on

* real JAX (``jax_api()`` below: ``jax.shard_map`` on 8 forced CPU devices, XLA computes the values),
* the NumPy front end (``spmdsim.shard_map`` + ``spmdsim.lax``, NumPy values, one thread per device),
* the JAX front end (unmodified ``jax.shard_map`` programs evaluated by spmdsim, threads or vectorized).

The ``api`` protocol (every case uses only these names):

``api.name``
    ``"jax"``, ``"numpy"``, ``"jaxpr"`` (JAX front end, thread executor) or ``"vectorized"``.
``api.shard_map(f, *, mesh, in_specs, out_specs, check_vma=True, axis_names=frozenset())``
    ``jax.shard_map``'s keywords. ``mesh=None`` means the context mesh (used by nested shard_maps only).
``api.mesh(shape, names)``
    A mesh of the first ``prod(shape)`` devices, row-major, with **Auto** axis types (JAX:
    ``jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=jax.devices()[:n])``).
``api.P``
    ``PartitionSpec``.
``api.lax``
    ``psum pmean pmax pmin all_gather(…, to=) psum_scatter all_to_all ppermute pshuffle pbroadcast axis_index
    axis_size pcast ragged_all_to_all psend precv`` with ``jax.lax``'s signatures.
``api.numpy``
    ``numpy`` in the NumPy front end, ``jax.numpy`` elsewhere. Case bodies only use what both spell the same
    (``full``, ``zeros``, ``ones``, ``arange``, ``concatenate``, ``stack``, ``reshape``, ``tanh``,
    ``maximum``, ``exp``, ``sqrt``, ``zeros_like``, ``float32``, ``int32``, array methods).

JAX-only names, used only by cases whose ``front_ends`` exclude ``"numpy"``:

``api.jax``
    The ``jax`` module as the front end sees it (real, or patched by spmdsim): ``jit``, ``grad``,
    ``value_and_grad``, ``vmap``, ``make_mesh`` (Explicit axes by default), ``device_put``, ``reshard``,
    ``set_mesh``, ``sharding.NamedSharding``, ``sharding.AxisType``, ``ShapeDtypeStruct``, ``lax.fori_loop``,
    ``lax.scan``, ``lax.cond``, ``lax.while_loop``.
``api.legacy_shard_map(f, mesh, in_specs, out_specs, check_rep=True)``
    ``jax.experimental.shard_map.shard_map`` (deprecated, still present in 0.10.2).

Fields of a case: ``raises`` is the class **name** JAX 0.10.2 raises on 8 CPU devices (``None``: JAX returns
a result), checked by ``conformance/shard_map_real_jax_check.py``; ``phrase`` must occur in JAX's message
(and in spmdsim's). ``expected`` (a callable of the args, returning the result pytree) is the documented
result for cases XLA:CPU cannot run (``ragged_all_to_all``, ``psend``/``precv``, ``pbroadcast``): there JAX
raises, and a simulator should return ``expected(*args)``. ``note`` says why a case is there when the reason
is a JAX inconsistency a simulator must decide on (see docs/notes/shard_map_jax_0_10_2.md).
"""
from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable
from typing import Any

import numpy as np

ALL_FRONT_ENDS = ("numpy", "jaxpr", "vectorized")
JAX_FRONT_ENDS = ("jaxpr", "vectorized")


@dataclasses.dataclass
class ShardMapCase:
    id: str
    area: str
    build: Callable[[Any], Callable]
    args: tuple
    front_ends: tuple = ALL_FRONT_ENDS
    phrase: str | None = None
    raises: str | None = None
    expected: Callable[..., Any] | None = None
    note: str = ""
    devices_needed: int = 8
    # jaxlib 0.12 aborts the whole process on some programs (an XLA check, no exception): JAX's side of such a
    # case runs in a fresh interpreter first (:func:`jax_outcome`)
    jax_may_abort: bool = False

    def describe(self) -> str:
        shapes = ", ".join(f"{np.asarray(a).dtype}{list(np.shape(a))}" if hasattr(a, "shape") or np.isscalar(a)
                           else type(a).__name__ for a in self.args)
        return f"shard_map case {self.id!r} (area {self.area}) on arguments ({shapes})"


def jax_api():
    """The api protocol over real JAX (devices must already be set up, e.g. ``jax_num_cpu_devices=8``)."""
    import warnings

    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType

    def mesh(shape, names):
        shape, names = tuple(shape), tuple(names)
        return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                             devices=jax.devices()[:math.prod(shape)])

    def shard_map(f, *, mesh, in_specs, out_specs, check_vma=True, axis_names=frozenset()):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma,
                             axis_names=axis_names)

    def legacy_shard_map(f, mesh, in_specs, out_specs, check_rep=True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from jax.experimental.shard_map import shard_map as legacy
        return legacy(f, mesh, in_specs, out_specs, check_rep=check_rep)

    return types.SimpleNamespace(name="jax", shard_map=shard_map, mesh=mesh, P=jax.sharding.PartitionSpec,
                                 lax=jax.lax, numpy=jnp, jax=jax, legacy_shard_map=legacy_shard_map)


def call(api, case: ShardMapCase):
    """(result, None) or (None, exception) for ``case`` on ``api``."""
    try:
        return case.build(api)(*case.args), None
    except Exception as e:  # noqa: BLE001 - compared by the caller
        return None, e


class JaxAborted(Exception):
    """What stands for real JAX's outcome where it aborts the process: the class the case documents (``raises``,
    what JAX 0.10 raised) is then what spmdsim must raise."""


def jax_outcome(case: ShardMapCase):
    """``call(jax_api(), case)``, except for a case that may abort the process: run in a fresh interpreter first,
    and where it aborts, ``(None, JaxAborted)`` whose public class is the case's documented one."""
    from conformance.harness import aborts

    if case.jax_may_abort and aborts("from conformance.shard_map_cases import CASES; from "
                                     "conformance.shard_map_harness import call, jax_api; "
                                     f"call(jax_api(), CASES[{case.id!r}])"):
        import builtins
        aborted = type("JaxAborted", (JaxAborted, getattr(builtins, case.raises or "Exception")), {})
        return None, aborted(f"JAX aborted the process; {case.phrase}")
    return call(jax_api(), case)


def public_class(error: BaseException) -> type:
    """JAX's exception class as a user catches it: the nearest built-in class in its MRO (IndivisibleError
    is a ValueError, JaxRuntimeError a RuntimeError, DuplicateSpecError a bare Exception)."""
    return next(c for c in type(error).__mro__ if c.__module__ == "builtins")


def compare_with_jax(case: ShardMapCase, api, jax_api_) -> None:
    """Run ``case`` on ``api`` and on real JAX and raise ``spmdsim.testing.Mismatch`` (an AssertionError) on a
    difference (see :func:`check_against`)."""
    check_against(case, api, *call(jax_api_, case))


def check_against(case: ShardMapCase, api, expected, jax_error, check_phrase: bool = True) -> None:
    """Compare ``api``'s run of ``case`` with JAX's outcome (``expected`` or ``jax_error``): result
    structure/shape/dtype/values, or exception class (and ``phrase``, with ``check_phrase``). Where JAX raises
    and the case has ``expected``, the front end must instead return ``expected(*case.args)``, unless it raises
    JAX's own error, class and message (jax_raise_on_ppermute_sort_diff, from JAX 0.11)."""
    from spmdsim.testing import Mismatch, assert_trees_match

    actual, error = call(api, case)
    same_error = error is not None and jax_error is not None and type(error) is type(jax_error) and \
        str(error) == str(jax_error)
    if jax_error is not None and case.expected is not None and not same_error:
        # (JAX raises where it cannot run the case, GPU-only collectives on CPU say; where the front end raises
        # JAX's very error, JAX's own rule of the installed release refused the program: so does spmdsim)
        if error is not None:
            raise Mismatch(f"{api.name} raised {type(error).__name__}: {error}; the documented result of "
                           f"{case.id} is {case.expected(*case.args)!r}") from error
        assert_trees_match(actual, case.expected(*case.args), out_axis=None, what=(api.name, "documented"))
        return
    if jax_error is not None:
        if error is None:
            raise Mismatch(f"jax raised {type(jax_error).__name__}: {str(jax_error)[:300]}\nbut {api.name} "
                           f"returned {actual!r}")
        if not isinstance(error, public_class(jax_error)):
            raise Mismatch(f"jax raised {type(jax_error).__name__}: {str(jax_error)[:300]}\nbut {api.name} "
                           f"raised {type(error).__name__}: {error}") from error
        for message, who in ((str(jax_error), "jax"), (str(error), api.name)):
            if check_phrase and case.phrase and case.phrase not in message:
                raise Mismatch(f"{who}'s error lacks the phrase {case.phrase!r}: {message}")
        return
    if error is not None:
        raise Mismatch(f"{api.name} raised {type(error).__name__}: {error}\nbut jax returned a result") from error
    assert_trees_match(actual, expected, out_axis=None, what=(api.name, "jax"))
