"""Coverage by construction: every primitive JAX 0.10 can emit (``spmdsim.jax.tools._coverage``) has a per-device
and a vectorized rule, except the listed exclusions (one reason each) and the collectives and higher-order
primitives that live with the executors; every covered primitive is in the differential table."""
import jax
import numpy as np
import pytest
from jax import lax

import spmdsim.jax as sjax
from conformance.lax_records import RECORDS
from spmdsim.jax.tools._coverage import EXCLUDED, LEAD_OWNED, PER_DEVICE_ONLY, enumerate_primitives
from spmdsim.jax.evaluation._registry import PER_DEVICE, VECTORIZED

pytestmark = pytest.mark.area("primitive coverage")

ENUMERATED, FOUND_IN = enumerate_primitives()
REQUIRED = ENUMERATED - set(EXCLUDED) - LEAD_OWNED


def test_the_enumeration_reaches_beyond_jax_lax():
    assert len(ENUMERATED) >= 180
    # primitives that only jax.numpy / jax.random / autodiff emit are found by tracing
    assert {"random_gamma", "platform_index", "add_any", "random_bits"} <= set(FOUND_IN)
    assert {"select_and_scatter_add", "unstack", "lt_to", "custom_linear_solve", "cholesky", "fft"} <= ENUMERATED


def test_covered_equals_enumerated_minus_exclusions_and_lead_owned():
    covered = {p for p in ENUMERATED if p in PER_DEVICE and p in VECTORIZED} - LEAD_OWNED
    assert covered == REQUIRED, (f"missing rules: {sorted(REQUIRED - covered)}; "
                                 f"covered but listed as excluded: {sorted(covered & set(EXCLUDED))}")


def test_exclusions_are_few_and_give_reasons():
    assert len(EXCLUDED) <= 10
    assert all(isinstance(reason, str) and len(reason) > 20 for reason in EXCLUDED.values())
    assert not set(EXCLUDED) & LEAD_OWNED
    assert set(EXCLUDED) <= ENUMERATED  # an exclusion names a primitive JAX can emit
    assert not set(EXCLUDED) & set(PER_DEVICE)


def test_every_per_device_rule_has_a_vectorized_twin():
    missing = set(PER_DEVICE) - set(VECTORIZED) - LEAD_OWNED - set(PER_DEVICE_ONLY)
    assert not missing, sorted(missing)
    assert set(PER_DEVICE_ONLY) <= set(PER_DEVICE)


# jax.lax.stage binds as the staged value itself (its bind rule skips the equation): it never appears in a jaxpr
NEVER_AN_EQUATION = {"stage"}


def test_every_covered_primitive_is_in_the_differential_table():
    untested = REQUIRED - {r.primitive for r in RECORDS} - NEVER_AN_EQUATION
    assert not untested, sorted(untested)


def test_a_primitive_without_a_rule_names_itself_its_parameters_and_the_line():
    def f(x):
        return x + lax.rng_uniform(np.float32(0), np.float32(1), (3,))

    closed = jax.make_jaxpr(f)(np.zeros(3, np.float32))
    with pytest.raises(NotImplementedError) as info:
        sjax.eval_jaxpr(closed.jaxpr, closed.consts, np.zeros(3, np.float32))
    message = str(info.value)
    assert "rng_uniform" in message and "params" in message and "test_primitive_coverage.py" in message
