"""Regressions from JAX's own op tests run on spmdsim (issue 26, failure class 7: results within a few ulps of
XLA:CPU's but outside those tests' tolerances), each against XLA:CPU with :func:`test_op_regressions.check`
(per device, vectorized rules against per-device rules, every executor of ``spmdsim.jax.pmap``).
``python -m conformance.jax_suite --ops`` is the measurement these come from (conformance/jax_suite/README.md).
"""
from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from conformance.test_op_regressions import check, per_device

pytestmark = pytest.mark.area("lax primitives vs XLA:CPU")


# -- lgamma: CHLO's Lanczos approximation, as XLA computes it ------------------------------------------------------

def test_lgamma_is_xlas_lanczos_approximation_float32():
    """lgamma(1) and lgamma(2) are 4.8e-7 and 0 in XLA (spmdsim gave SciPy's exact 0, 0): bit for bit where x >= 1/2
    (XLA's log, log1p, its reciprocal of 7.5 and its fused multiply-add); below 1/2 XLA:CPU's own float32 sin in
    the reflection is not ported: within 2 ulps."""
    rng = np.random.default_rng(0)
    big = per_device(lambda d: [np.concatenate([np.float32([1, 2, 3, 0.5, 1e-3, 1e30, np.inf, np.nan]),
                                                rng.uniform(0.5, 40, 500).astype(np.float32),
                                                np.exp(rng.uniform(-3, 60, 200)).astype(np.float32)])])
    check(lax.lgamma, big)
    small = per_device(lambda d: [np.concatenate([np.float32([0, -1, -2.5, -np.inf, 0.25]),
                                                  rng.uniform(-30, 0.5, 500).astype(np.float32)])])
    check(lax.lgamma, small, allowed=2)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_lgamma_of_low_precision_floats_is_float32_rounded_once(dtype):
    values = np.concatenate([np.arange(0.5, 40, 0.25), [1, 2, np.inf]]).astype(dtype)
    check(lax.lgamma, per_device(lambda d: [values]))


def test_lgamma_float64_is_xlas_algorithm():
    """float64 by the same algorithm (XLA: lgamma(2) = 8.9e-16, not SciPy's 0); XLA:CPU's float64 log and log1p
    differ from NumPy's in the last bits: within 8 eps of max(|lgamma|, 1)."""
    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        values = per_device(lambda d: [np.concatenate([np.arange(1.0, 12.0), rng.uniform(-30, 40, 300)])])
        check(lax.lgamma, values, allowed=("norm", 8 * np.finfo(np.float64).eps))
