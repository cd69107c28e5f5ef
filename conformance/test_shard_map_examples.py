"""The shard_map examples: each JAX program (examples/jax/) reaches its documented result on real JAX (8 CPU
devices) and gives the same numbers run unmodified by spmdsim (`spmdsim run`'s patching); each NumPy twin
(examples/) gives the JAX program's numbers too."""
import os
import runpy
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "jax")


def run_example(name: str, folder: str = EXAMPLES) -> dict:
    sys.path.insert(0, folder)
    try:
        return runpy.run_path(os.path.join(folder, f"{name}.py"))["main"]()
    finally:
        sys.path.remove(folder)


NAMES = ["shard_map_data_parallel", "shard_map_megatron_mlp", "shard_map_collective_matmul"]


def _numbers(result: dict) -> dict:
    return {k: np.asarray(v) for k, v in result.items() if np.asarray(v).dtype.kind in "fiu"}


@pytest.mark.area("examples-and-bits")
@pytest.mark.parametrize("name", NAMES)
def test_shard_map_example_under_spmdsim_equals_real_jax(name):
    from spmdsim.jax.integration._patch import patched_jax
    from spmdsim.testing import assert_trees_match

    real = _numbers(run_example(name))
    with patched_jax(8):
        simulated = _numbers(run_example(name))
    assert_trees_match(simulated, real, out_axis=None, rtol=1e-4, atol=1e-5)


@pytest.mark.area("examples-and-bits")
@pytest.mark.parametrize("name", NAMES)
def test_numpy_twin_equals_the_jax_example(name):
    from spmdsim.testing import assert_trees_match

    real = _numbers(run_example(name))
    twin = _numbers(run_example(name, os.path.join(ROOT, "examples")))
    shared = sorted(set(real) & set(twin))
    assert shared, (sorted(real), sorted(twin))
    assert_trees_match({k: twin[k] for k in shared}, {k: real[k] for k in shared}, out_axis=None, rtol=1e-4,
                       atol=1e-4)


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
