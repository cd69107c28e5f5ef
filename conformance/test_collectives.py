"""The conformance matrix: every case in cases.CASES against real jax.pmap (see harness.run_case)."""
import fnmatch
import os

import jax
import pytest

from conformance.cases import CASES
from conformance.harness import run_case
from conformance.known_differences import KNOWN_DIFFERENCES


ON_CPU = os.environ.get("SPMDSIM_CONFORMANCE_PLATFORM", "cpu") == "cpu"  # (conftest.py)


def _params():
    for case_id, case in CASES.items():
        marks = [pytest.mark.area(case.area)]
        reasons = [r for pattern, r in KNOWN_DIFFERENCES.items() if fnmatch.fnmatchcase(case_id, pattern)]
        if reasons:  # strict on XLA:CPU, which they describe; an accelerator may agree with spmdsim
            marks.append(pytest.mark.xfail(reason=reasons[0], strict=ON_CPU))
        yield pytest.param(case, id=case_id, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_case(case):
    if case.devices_needed > jax.device_count():
        pytest.skip(f"needs {case.devices_needed} devices, {jax.device_count()} present")
    run_case(case)


@pytest.mark.area("bookkeeping")
def test_every_known_difference_names_a_case():
    unused = [p for p in KNOWN_DIFFERENCES if not fnmatch.filter(CASES, p)]
    assert not unused, f"known differences that match no case: {unused}"


@pytest.mark.area("executors agree (spmdsim vs spmdsim)")
@pytest.mark.parametrize("other", ["vectorized", "reference", "vectorized-reference"])
@pytest.mark.parametrize("case", [pytest.param(c, id=i) for i, c in CASES.items() if "vectorized" in c.front_ends])
def test_executors_agree_bit_for_bit(case, other):
    """On every case (differences from JAX included), the vectorized executor (its compiled programs, and the
    reference interpreter loop) and the thread executor's reference loop against the thread executor's compiled
    programs: the same results bit for bit, or the same exception class."""
    from conformance.harness import APIS, _call
    from spmdsim.testing import assert_trees_match

    if case.devices_needed > jax.device_count():
        pytest.skip(f"needs {case.devices_needed} devices")
    threads, threads_error = _call(APIS["jaxpr"], case)
    result, error = _call(APIS[other], case)
    if threads_error is not None or error is not None:
        assert type(threads_error) is type(error), (threads_error, error)
        return
    assert_trees_match(result, threads, out_axis=case.out_axis, what=(other, "threads"), rtol=0, atol=0)
