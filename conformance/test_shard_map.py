"""The shard_map conformance area: every case of shard_map_cases.CASES on spmdsim's front ends against real
jax.shard_map on 8 CPU devices (JAX runs once per case; each front end is compared with it: results, or exception classes; JAX's message
texts are not required of spmdsim's, which say more).

Front ends: "numpy" (spmdsim.shard_map + spmdsim.lax, NumPy values), "jaxpr" (unmodified jax.shard_map
programs traced by JAX and run by spmdsim's thread executor) and "vectorized" (the same, all devices at once).
Deliberate differences are strict xfails with one reason each (SHARD_MAP_DIFFERENCES, and the README's table).
"""
from __future__ import annotations

import fnmatch
import functools
import types
import warnings

import jax
import numpy as np
import pytest

import spmdsim
import spmdsim.jax as sjax
from conformance.shard_map_cases import CASES
from conformance.shard_map_harness import check_against, jax_api, jax_outcome
from spmdsim.testing import Mismatch


class _JaxAsSeen(types.ModuleType):
    """``jax`` as a program sees it under spmdsim: ``jit`` and ``shard_map`` are spmdsim's."""

    def __init__(self, executor: str):
        super().__init__("jax")
        self._shard_map = functools.partial(sjax.shard_map, executor=executor)

    def __getattr__(self, name):
        if name == "shard_map":
            return self._shard_map
        if name == "jit":
            return sjax.jit
        return getattr(jax, name)


def _spmdsim_jax_api(executor: str):
    real = jax_api()
    smap = functools.partial(sjax.shard_map, executor=executor)

    def shard_map(f, *, mesh, in_specs, out_specs, check_vma=True, axis_names=frozenset()):
        return smap(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma,
                    axis_names=axis_names)

    def legacy_shard_map(f, mesh, in_specs, out_specs, check_rep=True):
        return smap(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_rep)

    return types.SimpleNamespace(name="jaxpr" if executor == "threads" else "vectorized", shard_map=shard_map,
                                 mesh=real.mesh, P=real.P, lax=jax.lax, numpy=real.numpy,
                                 jax=_JaxAsSeen(executor), legacy_shard_map=legacy_shard_map)


def _numpy_api():
    def mesh(shape, names):
        return spmdsim.make_mesh(shape, names)

    return types.SimpleNamespace(name="numpy", shard_map=spmdsim.shard_map, mesh=mesh, P=spmdsim.P,
                                 lax=spmdsim.lax, numpy=np)


APIS = {"numpy": _numpy_api, "jaxpr": lambda: _spmdsim_jax_api("threads"),
        "vectorized": lambda: _spmdsim_jax_api("vectorized")}

# case id (fnmatch pattern) -> the one reason (strict xfails; the README's table lists the decisions)
SHARD_MAP_DIFFERENCES: dict[str, str] = {
    # The NumPy front end has no types: replication is checked by value, so JAX's type errors cannot happen.
    "psum-positional-and-named-checked": "NumPy front end: no varying-axes types; JAX rejects this psum by type",
    "vma-pcast-already-varying": "NumPy front end: no varying-axes types; JAX rejects pcast of a varying value",
    # As in the pmap area: XLA:CPU cannot reduce complex max/min; spmdsim's is lexicographic.
    "dtype-pmax-complex64": "pmax of complex: XLA:CPU UNIMPLEMENTED; spmdsim computes the lexicographic max",
    "groups-pmean-uneven-unchecked": "pmean with uneven groups: JAX divides by len(groups[0])",
    "groups-partial-cover-unchecked": "groups covering part of the axis: JAX fails in XLA, spmdsim raises "
                                      "ValueError",
    "groups-p*-checked-not-implemented": "psum/pmean with groups under check_vma=True: JAX 0.10 raises an empty "
                                         "NotImplementedError; the NumPy front end computes it",
    "jit-two-meshes": "two shard_maps over different meshes in one jit: JAX 0.10 raises IndivisibleError; spmdsim "
                      "gives the eager result",
    "nested-inner-collective-over-outer-axis": "a collective over the outer axis inside a nested shard_map: JAX "
                                               "0.10 raises a wrong divisibility error; spmdsim computes it",
    "error-psum-tuple-with-unknown-axis": "psum over a tuple with an unbound name: JAX's varying-axes check says "
                                          "ValueError first; spmdsim raises its unbound-axis NameError",
}


def _params():
    for case_id, case in CASES.items():
        marks = [pytest.mark.area("shard_map")]
        reasons = [r for pattern, r in SHARD_MAP_DIFFERENCES.items() if fnmatch.fnmatchcase(case_id, pattern)]
        if reasons:
            marks.append(pytest.mark.xfail(reason=reasons[0], strict=True))
        yield pytest.param(case, id=case_id, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_shard_map_case(case):
    if case.devices_needed > jax.device_count():
        pytest.skip(f"needs {case.devices_needed} devices")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        expected, jax_error = jax_outcome(case)
        failures = []
        for front_end in case.front_ends:
            try:
                check_against(case, APIS[front_end](), expected, jax_error, check_phrase=False)
            except Mismatch as e:
                failures.append(f"[{front_end}] {e}")
    assert not failures, f"{case.describe()}:\n" + "\n".join(failures)


@pytest.mark.area("bookkeeping")
def test_every_shard_map_difference_names_a_case():
    unused = [p for p in SHARD_MAP_DIFFERENCES if not fnmatch.filter(CASES, p)]
    assert not unused, f"shard_map differences that match no case: {unused}"


def test_there_are_at_least_400_cases_on_both_front_ends():
    both = [c for c in CASES.values() if "numpy" in c.front_ends and "jaxpr" in c.front_ends]
    assert len(both) >= 400
