"""``spmdsim compare`` / ``spmdsim.testing.compare``: a planted difference is found at its equation, line and
device (a rule one ulp off on one device through a test double of the registry, another reduction order, an ISA
pinned below this CPU's), under pmap (both executors), shard_map, grad of a pmap and jit; a program with no
difference reports none; the JSON report validates against its schema. Real XLA:CPU is the other side."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import spmdsim
from spmdsim import _runtime
from spmdsim.jax import _registry
from spmdsim.jax._compare import SCHEMA_PATH, Against, distance
from spmdsim.testing import compare

HERE = os.path.basename(__file__)
N = 8


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(k for k, text in enumerate(f, 1) if text.rstrip().endswith(marker) and "_line(" not in text)


# -- the programs: elementwise float32 work that XLA:CPU and spmdsim compute bit for bit, and a psum ---------

def step(x, w):
    h = jnp.exp(x * w) + 1.0  # <- exp
    return jax.lax.psum(h * h, "i")  # <- psum


def loss(w, x):
    return jnp.exp(x * w).sum()  # <- loss exp


def shard_body(x):
    return jax.lax.psum(jnp.exp(x) * 0.5, "y")  # <- shard exp


X = (np.arange(N * 4, dtype=np.float32).reshape(N, 4) / 7 - 2).astype(np.float32)
W = np.float32(0.3)


# -- a test double: one rule one ulp off on one device -----------------------------------------------------

def _one_ulp(x):
    x = np.asarray(x)
    return np.nextafter(x, np.array(np.inf, x.dtype))


def plant(monkeypatch, name: str, device: int):
    """The per-device and vectorized rules of ``name`` give one ulp more on ``device`` (row-major index)."""
    per_device, stacked = _registry.PER_DEVICE[name], _registry.VECTORIZED[name]

    def off_per_device(*operands, **params):
        out = per_device(*operands, **params)
        lane = _runtime.current_lane()
        return _one_ulp(out) if lane is not None and lane.label.startswith(f"device {device} ") else out

    def off_stacked(*operands, **params):
        out = np.array(stacked(*operands, **params))
        if out.shape[0] == N:
            out[device] = _one_ulp(out[device])
        return out

    monkeypatch.setitem(_registry.PER_DEVICE, name, off_per_device)
    monkeypatch.setitem(_registry.VECTORIZED, name, off_stacked)


def first(report):
    assert report.differences, report.text()
    return report.differences[0]


def assert_found(report, primitive: str, marker: str, devices):
    d = first(report)
    assert d.primitive == primitive, report.text()
    assert f"{HERE}:{_line(marker)}:" in d.site, d.site
    assert d.devices == devices, report.text()
    return d


def validate(document: dict) -> None:
    with open(SCHEMA_PATH) as f:
        schema = json.load(f)
    try:
        import jsonschema
    except ImportError:  # the documented keys, by hand
        assert set(document) == set(schema["required"])
        for d in document["differences"]:
            assert set(d) == set(schema["properties"]["differences"]["items"]["required"])
        return
    jsonschema.validate(document, schema)


# -- no difference -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_a_program_without_difference_reports_none_and_its_json_validates(executor):
    report = compare(step, X, W, axis_name="i", in_axes=(0, None), executor=executor)
    assert not report, report.text()
    assert report.compared > 0 and report.drift and all(d.ulps == 0 for d in report.drift), report.text()
    np.testing.assert_array_equal(report.result, spmdsim.jax.pmap(step, "i", in_axes=(0, None))(X, W))
    document = json.loads(json.dumps(report.to_json()))
    validate(document)
    assert document["differences"] == [] and document["against"] == "xla"


def test_the_executors_agree_equation_by_equation():
    report = compare(step, X, W, axis_name="i", in_axes=(0, None), against="executor=vectorized")
    assert not report and report.compared > 0, report.text()


# -- a rule one ulp off on device 2 ---------------------------------------------------------------------------

@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_a_rule_one_ulp_off_is_found_at_its_equation_line_and_device_in_a_pmap(monkeypatch, executor):
    plant(monkeypatch, "exp", 2)
    report = compare(step, X, W, axis_name="i", in_axes=(0, None), executor=executor)
    d = assert_found(report, "exp", "# <- exp", ["device 2 [i=2]"])
    assert d.ulps == 1 and d.absolute > 0 and d.operands == [((4,), "float32")]
    assert len(report.differences) == 1, report.text()  # later equations took the same operands on both sides
    assert report.drift[0].ulps > 0  # ... but the outputs drifted
    document = report.to_json()
    validate(document)
    assert document["differences"][0]["devices"] == ["device 2 [i=2]"]


def test_found_in_a_shard_map_on_a_two_axis_mesh(monkeypatch):
    plant(monkeypatch, "exp", 5)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:N]).reshape(4, 2), ("x", "y"))
    # built inside the compared function, where jax.shard_map is spmdsim's (as in a script under spmdsim compare)
    report = compare(lambda x: jax.shard_map(shard_body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", None))(x),
                     np.arange(32, dtype=np.float32).reshape(8, 4) / 9)
    assert_found(report, "exp", "# <- shard exp", ["device 5 [x=2, y=1]"])
    validate(report.to_json())


def test_found_under_grad_of_a_pmap(monkeypatch):
    plant(monkeypatch, "exp", 3)
    mapped = jax.pmap(loss, "i", in_axes=(None, 0))
    report = compare(jax.grad(lambda w, x: mapped(w, x).sum()), W, X)
    assert_found(report, "exp", "# <- loss exp", ["device 3 [i=3]"])


def test_found_in_a_program_under_jit(monkeypatch):
    plant(monkeypatch, "exp", 6)
    program = jax.jit(lambda x, w: jax.pmap(step, "i", in_axes=(0, None))(x, w) * 2.0)
    report = compare(program, X, W)
    assert_found(report, "exp", "# <- exp", ["device 6 [i=6]"])


def inner_body(x):
    return jax.lax.psum(jnp.exp(x), "j")  # <- inner exp


def test_found_in_a_nested_map(monkeypatch):
    plant(monkeypatch, "exp", 5)
    report = compare(lambda x: spmdsim.jax.pmap(inner_body, "j")(x) * 2.0,
                     X.reshape(4, 2, 4), axis_name="i")
    assert_found(report, "exp", "# <- inner exp", ["device 5 [i=2, j=1]"])


def test_a_per_device_rule_off_is_found_against_the_vectorized_executor(monkeypatch):
    stacked = _registry.VECTORIZED["exp"]
    plant(monkeypatch, "exp", 4)
    monkeypatch.setitem(_registry.VECTORIZED, "exp", stacked)  # only the thread executor's rule is off
    report = compare(step, X, W, axis_name="i", in_axes=(0, None), against="executor=vectorized")
    assert_found(report, "exp", "# <- exp", ["device 4 [i=4]"])


# -- a reduction order ------------------------------------------------------------------------------------------

SUMMANDS = np.array([1.0, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24],
                    np.float32)[:, None] * np.ones((N, 4), np.float32)


def plain_psum(x):
    return jax.lax.psum(x, "i")  # <- plain psum


def test_a_reduction_order_is_found_at_the_psum_on_every_device():
    every = [f"device {k} [i={k}]" for k in range(N)]
    with spmdsim.set_reduction_order("pairwise"):  # spmdsim folds pairwise; XLA:CPU in rank order
        report = compare(plain_psum, SUMMANDS, axis_name="i")
    d = assert_found(report, "psum", "# <- plain psum", every)
    assert d.ulps > 0
    # and the question the other way round: which collective would another order change?
    report = compare(plain_psum, SUMMANDS, axis_name="i", against="order=pairwise", executor="vectorized")
    assert_found(report, "psum", "# <- plain psum", every)
    assert compare(plain_psum, SUMMANDS, axis_name="i", against="order=sequential").differences == []


def test_tolerances():
    with spmdsim.set_reduction_order("pairwise"):
        exact = compare(plain_psum, SUMMANDS, axis_name="i")
        ulps = int(exact.differences[0].ulps)
        assert not compare(plain_psum, SUMMANDS, axis_name="i", ulps=ulps)
        assert compare(plain_psum, SUMMANDS, axis_name="i", ulps=ulps - 1)
        assert not compare(plain_psum, SUMMANDS, axis_name="i", rtol=1e-6)


# -- an ISA pinned below this CPU's, through the command ------------------------------------------------------------

SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
x = np.linspace(-3, 3, 8 * 64, dtype=np.float32).reshape(8, 64)
print(jax.pmap(lambda b: jax.lax.psum(jnp.exp(b), "i"), "i")(x)[0, 0])  # <- script exp
"""


def test_the_command_finds_an_isa_pinned_without_fma_and_writes_valid_json(tmp_path):
    from spmdsim.jax import _xla_cpu_isa
    if not _xla_cpu_isa.model(_xla_cpu_isa._cpu_flags()).fma:
        pytest.skip("this CPU has no FMA: XLA:CPU computes exp without it too")
    script, out = tmp_path / "prog.py", tmp_path / "report.json"
    script.write_text(SCRIPT)
    env = dict(os.environ, SPMDSIM_XLA_CPU_ISA="AVX", PYTHONPATH=os.path.dirname(os.path.dirname(
        os.path.abspath(spmdsim.__file__))))
    done = subprocess.run([sys.executable, "-m", "spmdsim", "compare", str(script), "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr  # 1: some equation differs
    assert "equations that differ" in done.stdout and "exp" in done.stdout
    document = json.loads(out.read_text())
    validate(document)
    d = document["differences"][0]
    assert d["primitive"] == "exp" and "prog.py:4:" in d["site"] and d["devices"], done.stdout


# -- the pieces ----------------------------------------------------------------------------------------------------

def test_distance_in_ulps():
    one = np.float32(1)
    ulps, absolute = distance(np.array([one, np.nextafter(one, np.float32(2)), -0.0, np.nan, np.nan], np.float32),
                              np.array([one, one, 0.0, np.nan, 1.0], np.float32))
    assert ulps.tolist() == [0, 1, 0, 0, np.inf] and absolute[1] == 2.0**-23
    assert distance(np.array([np.float32(-1e-45)]), np.array([np.float32(1e-45)]))[0].tolist() == [2]
    assert distance(np.array([3, 7], np.int32), np.array([3, 4], np.int32))[0].tolist() == [0, 3]
    bf16 = jnp.bfloat16
    assert distance(np.array([1, 2], bf16), np.array([1, 2], bf16))[0].tolist() == [0, 0]


def test_against_is_parsed_and_wrong_forms_are_explained():
    assert str(Against.parse("order=ring")) == "order=ring" and Against.parse("xla").kind == "xla"
    with pytest.raises(ValueError, match="expected xla, order=ORDER"):
        Against.parse("order=tree")
