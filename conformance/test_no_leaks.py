"""A program spmdsim has run keeps nothing alive once the program is gone: JAX's ``test_cond_memory_leak``
(lax_control_flow_test) counts live arrays after one garbage collection. Two holders used to keep a closed-over
array alive: the compiled program (its function and its globals referred to each other, a cycle that outlived
the jaxpr until a later collection) and the multiply-add contraction cache (a jaxpr without contractions was
cached as its own value, so its weak key never died)."""
from __future__ import annotations

import gc

import jax
import numpy as np
import pytest

from spmdsim.primitives._batch import Batch
from spmdsim.jax.evaluation import _interpreter

pytestmark = pytest.mark.area("JAX front end")


def _run_and_forget(evaluate):
    data = jax.device_put(np.zeros(1024, dtype=np.float32) + 1)
    g = lambda: jax.lax.cond(True, jax.jit(lambda: data[0]), lambda: data[1])  # noqa: E731
    closed = jax.make_jaxpr(g)()
    out = evaluate(closed)
    assert float(np.asarray(out[0])) == 1.0
    del g, closed, data, out
    gc.collect()


@pytest.mark.parametrize("how", ["per-device", "reference", "vectorized"])
def test_closed_over_array_freed_after_one_collection(how):
    evaluate = {
        "per-device": lambda c: _interpreter.PER_DEVICE.eval_jaxpr(c.jaxpr, c.consts, []),
        "reference": lambda c: _interpreter.REFERENCE.eval_jaxpr(c.jaxpr, c.consts, []),
        "vectorized": lambda c: [o[0] for o in _interpreter.Vectorized(Batch((("device", 1),))).eval_jaxpr(
            c.jaxpr, c.consts, [])],
    }[how]
    gc.collect()
    before = len(jax.live_arrays())
    _run_and_forget(evaluate)
    assert len(jax.live_arrays()) <= before
