"""The shard_map examples under examples/jax/ on real JAX (8 CPU devices): each reaches its documented result.

(Their NumPy-front-end twins under examples/ need spmdsim.shard_map, issue 12; once it exists they should be
compared with these, as test_examples_and_bits.py does for the pmap examples.)
"""
import os
import runpy
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "jax")


def run_example(name: str) -> dict:
    sys.path.insert(0, EXAMPLES)
    try:
        return runpy.run_path(os.path.join(EXAMPLES, f"{name}.py"))["main"]()
    finally:
        sys.path.remove(EXAMPLES)


@pytest.mark.area("examples-and-bits")
def test_shard_map_data_parallel_reaches_lstsq():
    out = run_example("shard_map_data_parallel")
    learned = np.r_[np.asarray(out["w"]), np.asarray(out["b"])[None]]
    assert np.max(np.abs(learned - out["reference"])) < 1e-4
    assert np.asarray(out["losses"])[-1] < np.asarray(out["losses"])[0]


@pytest.mark.area("examples-and-bits")
def test_shard_map_megatron_mlp_equals_one_device_training():
    out = run_example("shard_map_megatron_mlp")
    assert float(out["gap"]) < 1e-5
    assert np.asarray(out["losses"])[-1] < np.asarray(out["losses"])[0]


@pytest.mark.area("examples-and-bits")
def test_shard_map_collective_matmuls_equal_the_plain_product():
    out = run_example("shard_map_collective_matmul")
    for key in ("allgather_matmul", "reducescatter_matmul"):
        np.testing.assert_allclose(np.asarray(out[key]), out["expected"], rtol=1e-5, atol=1e-5)
