"""Run one case four ways and compare: the NumPy front end (spmdsim.pmap + spmdsim.lax), the JAX front end
(spmdsim.jax.pmap + jax.lax, values by NumPy from the jaxpr) with its thread executor and with its
vectorized executor, and real jax.pmap (XLA).

A case's ``build(api)`` returns the mapped callable written against ``api.pmap``, ``api.vmap`` and ``api.lax``,
so one definition serves all three. Results are compared by :func:`spmdsim.testing.assert_trees_match`
(structure, shape, dtype, then values: exact for integers and bools, dtype-aware tolerances for floats). When
JAX raises, each front end must raise an exception of the same class (and contain ``phrase`` if given).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import signal
import subprocess
import sys
import types
from typing import Any, Callable

import jax
import numpy as np

import spmdsim
import spmdsim.jax as sjax
from spmdsim.runtime import _devices
from spmdsim.testing import Mismatch, TooFewJaxDevices, assert_trees_match

APIS = {
    "numpy": types.SimpleNamespace(name="numpy", lax=spmdsim.lax, pmap=spmdsim.pmap, vmap=spmdsim.vmap),
    "jaxpr": types.SimpleNamespace(name="jaxpr", lax=jax.lax, pmap=sjax.pmap, vmap=jax.vmap),
    "vectorized": types.SimpleNamespace(name="vectorized", lax=jax.lax, pmap=functools.partial(
        sjax.pmap, executor="vectorized"), vmap=jax.vmap),
    "reference": types.SimpleNamespace(name="reference", lax=jax.lax, pmap=functools.partial(
        sjax.pmap, executor="reference"), vmap=jax.vmap),
    "vectorized-reference": types.SimpleNamespace(name="vectorized-reference", lax=jax.lax,
                                                  pmap=lambda *a, **k: _reference_loop(sjax.pmap(
                                                      *a, **k, executor="vectorized")), vmap=jax.vmap),
    "jax": types.SimpleNamespace(name="jax", lax=jax.lax, pmap=jax.pmap, vmap=jax.vmap),
}


def _reference_loop(mapped: Callable) -> Callable:
    """``mapped`` (a vectorized ``spmdsim.jax.pmap``) evaluating its jaxprs with the reference loop instead of
    their compiled programs."""
    from spmdsim.jax.evaluation._interpreter import Vectorized

    @functools.wraps(mapped)
    def call(*args, **kwargs):
        saved, Vectorized.compiled = Vectorized.compiled, False
        try:
            return mapped(*args, **kwargs)
        finally:
            Vectorized.compiled = saved
    return call


@dataclasses.dataclass
class Case:
    id: str
    area: str
    build: Callable[[Any], Callable]
    args: tuple
    front_ends: tuple = ("numpy", "jaxpr", "vectorized")
    phrase: str | None = None
    out_axis: int | None = 0
    devices_needed: int = 1
    # jaxlib 0.12 aborts the whole process on some programs (an XLA check failure, no exception): the JAX side
    # of such a case runs in a fresh interpreter first (see :func:`_jax_aborts`)
    jax_may_abort: bool = False

    def describe(self) -> str:
        shapes = ", ".join(f"{np.asarray(a).dtype}{list(np.shape(a))}" if hasattr(a, "shape") or np.isscalar(a)
                           else type(a).__name__ for a in self.args)
        return f"case {self.id!r} (area {self.area}) on arguments ({shapes})"


def public_class(error: BaseException) -> type:
    """JAX's exception class as a user catches it: the nearest built-in class (IndivisibleError is a
    ValueError, JaxRuntimeError a RuntimeError)."""
    return next(c for c in type(error).__mro__ if c.__module__ == "builtins")


def _call(api, case: Case):
    try:
        return case.build(api)(*case.args), None
    except Exception as e:  # noqa: BLE001 - compared by the caller
        return None, e


def aborts(code: str) -> bool:
    """Whether Python ``code`` (running real JAX) kills its process (SIGABRT from an XLA check: jaxlib 0.12 on
    some programs), run in a fresh interpreter with 8 CPU devices from the repository's root."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return out.returncode in (-signal.SIGABRT, 128 + signal.SIGABRT)


def _jax_aborts(case: Case) -> bool:
    """Whether real jax.pmap kills the process on ``case``."""
    return aborts("import conformance.test_collectives as t; from conformance.harness import APIS, _call; "
                  f"_call(APIS['jax'], t.CASES[{case.id!r}])")


def _against_an_abort(case: Case) -> None:
    """Where the installed JAX aborts the process, spmdsim answers as JAX 0.10 did: the error of the case's
    phrase; a case without one is a documented difference (README's table): JAX aborts, spmdsim computes."""
    for front_end in case.front_ends:
        actual, error = _call(APIS[front_end], case)
        if case.phrase is None:
            raise Mismatch(f"jax.pmap aborts the process on {case.describe()}; the {front_end} front end "
                           f"{'raised ' + type(error).__name__ if error is not None else 'returned a result'}")
        if error is None or case.phrase not in str(error):
            raise Mismatch(f"jax.pmap aborts the process; the {front_end} front end should raise the error with "
                           f"{case.phrase!r}, got {error!r}")


def devices_beyond_jax(case: Case) -> int | None:
    """Where jax has fewer devices than a CPU run's 8 (one GPU: ``spmdsim conformance --platform gpu``): the
    devices ``case`` maps over if that is more than jax has, as spmdsim tells when it has only jax's devices
    (its error names the count it needs); else None."""
    have = jax.device_count()
    if have >= 8 or not case.front_ends:
        return None
    with spmdsim.set_device_count(have), _devices.devices_hint("<<{n} devices>>"):
        _, error = _call(APIS[case.front_ends[0]], case)
    needed = re.search(r"<<(\d+) devices>>", str(error)) if error is not None else None
    return int(needed.group(1)) if needed else None


def run_case(case: Case) -> None:
    """Compare every front end of ``case`` with real jax.pmap; raise Mismatch with a repro note, or
    TooFewJaxDevices where jax has fewer devices than the case maps over."""
    if (needed := devices_beyond_jax(case)) is not None:
        raise TooFewJaxDevices(f"{case.id} maps over {needed} devices; jax has {jax.device_count()} "
                               f"({jax.default_backend()})")
    if case.jax_may_abort and _jax_aborts(case):
        return _against_an_abort(case)
    expected, jax_error = _call(APIS["jax"], case)
    for front_end in case.front_ends:
        actual, error = _call(APIS[front_end], case)
        try:
            if jax_error is not None:
                if error is None:
                    raise Mismatch(f"jax.pmap raised {type(jax_error).__name__}: {jax_error}\nbut the {front_end} "
                                   f"front end returned {actual!r}")
                if not isinstance(error, public_class(jax_error)):
                    raise Mismatch(f"jax.pmap raised {type(jax_error).__name__}: {str(jax_error)[:300]}\nbut the "
                                   f"{front_end} front end raised {type(error).__name__}: {error}") from error
                for message, who in ((str(jax_error), "jax"), (str(error), front_end)):
                    if case.phrase and case.phrase not in message:
                        raise Mismatch(f"{who}'s error lacks the phrase {case.phrase!r}: {message}")
                continue
            if error is not None:
                raise Mismatch(f"the {front_end} front end raised {type(error).__name__}: {error}\nbut jax.pmap "
                               f"returned a result") from error
            assert_trees_match(actual, expected, out_axis=case.out_axis, what=(front_end, "jax"))
        except Mismatch as e:
            e.add_note(f"{case.describe()}, {front_end} front end.\nRepro:\n"
                       f"  import conformance.test_collectives as t; from conformance.harness import run_case\n"
                       f"  run_case(t.CASES[{case.id!r}])")
            raise
