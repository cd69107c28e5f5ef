"""``spmdsim compare`` / ``spmdsim.testing.compare``: a planted difference is found at its equation, line and
device (a rule one ulp off on one device through a test double of the registry, another reduction order, an ISA
pinned below this CPU's), under pmap (both executors), shard_map, grad of a pmap and jit; a program with no
difference reports none; the JSON report validates against its schema. Real XLA:CPU is the other side. Also: a
psum_scatter re-folded in another order, the iteration where a loop body first differed, the progress bar, and
``spmdsim compare --hosts 2`` (MPI; skipped without mpi4py and mpiexec)."""
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
from spmdsim.runtime import _runtime
from spmdsim.jax.evaluation import _registry
from spmdsim.jax.tools._compare_report import SCHEMA_PATH, Against, distance
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
    from spmdsim.jax.numerics import _xla_cpu_isa
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


# -- psum_scatter (reduce_scatter) re-folded in another order ---------------------------------------------------
#
# Device d contributes v_d * 2**r to row r, with v = SUMMANDS' column (1, then seven 2**-24). Rank order: each
# 2**-24 is absorbed by 1 (a tie, rounded to even), the sum is 1. Pairwise: 1 + 2**-24 -> 1, pairs of 2**-24 ->
# 2**-23, ... -> 1 + 2**-23 + 2**-22 = 1 + 3 * 2**-23 exactly: 3 ulps of float32 above 1, in every row (scaled
# by 2**r, exactly). A wrong slice (another rank's row) would be 2**r off: the same order must find nothing.

SCATTERED = SUMMANDS[:, :1, None] * (2.0 ** np.arange(N, dtype=np.float32))[None, :, None] * np.ones((1, 1, 4),
                                                                                                    np.float32)


def plain_scatter(x):
    return jax.lax.psum_scatter(x, "i")  # <- plain scatter


def tiled_scatter(x):
    return jax.lax.psum_scatter(x, "i", scatter_dimension=1, tiled=True)  # <- tiled scatter


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_a_psum_scatter_is_refolded_in_the_other_order(executor):
    every = [f"device {k} [i={k}]" for k in range(N)]
    report = compare(plain_scatter, SCATTERED, axis_name="i", against="order=pairwise", executor=executor)
    d = assert_found(report, "reduce_scatter", "# <- plain scatter", every)
    assert d.ulps == 3 and d.absolute == 3 * 2.0**-23 * 2.0**(N - 1), report.text()  # the largest row: 2**7
    assert len(report.differences) == 1 and report.drift[0].ulps == 3, report.text()
    same = compare(plain_scatter, SCATTERED, axis_name="i", against="order=sequential", executor=executor)
    assert not same and same.compared > 0, same.text()
    with spmdsim.set_reduction_order("pairwise"):  # spmdsim folds pairwise; XLA:CPU in rank order
        assert_found(compare(plain_scatter, SCATTERED, axis_name="i", executor=executor), "reduce_scatter",
                     "# <- plain scatter", every)


def test_a_tiled_psum_scatter_in_groups_is_refolded_in_the_other_order():
    # rows of 2 elements per device along dimension 1; groups {0, 2, 4, 6} and {1, 3, 5, 7}: group sums of four
    x = np.transpose(SCATTERED, (0, 2, 1)).copy()  # (N, 4, N): the scattered dimension is 1 after the map's
    x[1::2] = x[::2]  # both groups sum (1, three 2**-24): rank order 1; pairwise 1 + 2**-23 (1 ulp)
    groups = [[0, 2, 4, 6], [1, 3, 5, 7]]
    body = lambda v: jax.lax.psum_scatter(v, "i", scatter_dimension=1, tiled=True,  # <- grouped scatter
                                          axis_index_groups=groups)
    for executor in ("threads", "vectorized"):
        report = compare(body, x, axis_name="i", against="order=pairwise", executor=executor)
        d = assert_found(report, "reduce_scatter", "# <- grouped scatter", [f"device {k} [i={k}]" for k in range(N)])
        assert d.ulps == 1 and d.results == [((4, 2), "float32")], report.text()
        same = compare(body, x, axis_name="i", against="order=sequential", executor=executor)
        assert not same and same.compared > 0, same.text()


# -- drift accumulated over loops: the iteration where an equation first differed ---------------------------

def plant_when(monkeypatch, name: str, off):
    """The rules of ``name`` give one ulp more on a device whose operand ``off(operand)`` selects."""
    per_device, stacked = _registry.PER_DEVICE[name], _registry.VECTORIZED[name]

    def off_per_device(x, **params):
        out = per_device(x, **params)
        return _one_ulp(out) if off(np.asarray(x)) else out

    def off_stacked(x, **params):
        out = np.array(stacked(x, **params))
        for d in range(out.shape[0]):
            if off(np.asarray(x)[d]):
                out[d] = _one_ulp(out[d])
        return out

    monkeypatch.setitem(_registry.PER_DEVICE, name, off_per_device)
    monkeypatch.setitem(_registry.VECTORIZED, name, off_stacked)


def looped(x):
    def body(i, acc):
        return acc + jnp.exp(x + i.astype(jnp.float32))  # <- loop exp
    return jax.lax.fori_loop(0, 6, body, jnp.zeros_like(x))


def while_looped(x):
    def body(carry):
        i, acc = carry
        return i + 1, acc + jnp.exp(x + i.astype(jnp.float32))  # <- while exp
    return jax.lax.while_loop(lambda c: c[0] < 6, body, (0, jnp.zeros_like(x)))[1]


def nested_loops(x):
    def outer(j, acc):
        def inner(i, acc):
            return acc + jnp.exp(x + (10 * j + i).astype(jnp.float32))  # <- nested exp
        return jax.lax.fori_loop(0, 4, inner, acc)
    return jax.lax.fori_loop(0, 3, outer, jnp.zeros_like(x))


ZEROS = np.zeros((N, 4), np.float32)


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
@pytest.mark.parametrize("program,marker", [(looped, "# <- loop exp"), (while_looped, "# <- while exp")])
def test_the_first_iteration_where_a_loop_body_differs(monkeypatch, executor, program, marker):
    # exp's operand is the iteration number i (x is 0): a rule off from 3 on differs in iterations 3, 4 and 5 of 6
    plant_when(monkeypatch, "exp", lambda v: bool(np.any(v >= 3)))
    report = compare(program, ZEROS, axis_name="i", executor=executor)
    d = assert_found(report, "exp", marker, [f"device {k} [i={k}]" for k in range(N)])
    assert d.iteration == [3] and d.iterations == 3, report.text()
    per_step = N if executor == "threads" else 1  # a device thread's evaluation, or one vectorized step
    assert (d.occurrences, d.evaluations) == (3 * per_step, 6 * per_step), report.text()
    assert "iteration 3 (3 iterations)" in report.text() and f"{3 * per_step} of {6 * per_step}" in report.text()
    document = report.to_json()
    validate(document)
    assert document["differences"][0]["iteration"] == [3]


def test_the_iteration_of_each_nested_loop(monkeypatch):
    plant_when(monkeypatch, "exp", lambda v: bool(np.any(v == 12)))  # j = 1, i = 2 only
    report = compare(nested_loops, ZEROS, axis_name="i", executor="vectorized")
    d = assert_found(report, "exp", "# <- nested exp", [f"device {k} [i={k}]" for k in range(N)])
    assert (d.iteration, d.iterations, d.occurrences, d.evaluations) == ([1, 2], 1, 1, 12), report.text()
    validate(report.to_json())


def test_an_equation_outside_loops_has_no_iteration(monkeypatch):
    plant(monkeypatch, "exp", 2)
    d = first(compare(step, X, W, axis_name="i", in_axes=(0, None)))
    assert d.iteration is None and d.iterations == 0 and (d.occurrences, d.evaluations) == (1, N)


# -- the progress bar on long runs ------------------------------------------------------------------------------

class _Terminal:
    """A stand-in for a terminal on stderr: rich draws on it as on a real one."""

    def __init__(self):
        self.text = []

    def write(self, text):
        self.text.append(text)
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return True

    def fileno(self):
        raise OSError("no file descriptor")


def test_a_long_comparison_shows_a_progress_bar_on_a_terminal_and_removes_it(monkeypatch):
    pytest.importorskip("rich")
    from spmdsim.jax.tools import _compare
    started = []
    real = _compare._Progress.update

    def update(self, compared, differing):
        real(self, compared, differing)
        if self.bar:
            started.append((compared, differing, self.bar.live.is_started))

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(_compare._Progress, "DELAY", 0.0)  # "long" from the start
    monkeypatch.setattr(_compare._Progress, "INTERVAL", 0.0)  # and redrawn at every equation
    monkeypatch.setattr(_compare._Progress, "update", update)
    plant_when(monkeypatch, "exp", lambda v: bool(np.any(v >= 3)))
    report = compare(looped, ZEROS, axis_name="i", executor="vectorized", progress=True)
    assert report.differences and started, report.text()
    # it counted along: the evaluations compared grow to the report's count, and the one differing equation shows
    assert [c for c, _, _ in started] == sorted(c for c, _, _ in started) and started[-1][0] == report.compared
    assert started[-1][1] == 1 and all(live for _, _, live in started)
    drawn = "".join(terminal.text)
    assert f"compared {report.compared} equation evaluations, 1 equations differ" in drawn, drawn[-500:]
    # transient: the cursor, hidden while it is drawn, is shown again, and no live display is left refreshing
    assert drawn.index("\x1b[?25l") < drawn.rindex("\x1b[?25h"), drawn[-500:]
    import threading
    from rich.live import _RefreshThread
    assert all(t.done.is_set() for t in threading.enumerate() if isinstance(t, _RefreshThread))  # told to stop


def test_no_progress_bar_off_a_terminal_or_on_a_short_run(monkeypatch):
    from spmdsim.jax.tools import _compare
    quiet = _Terminal()
    quiet.isatty = lambda: False
    monkeypatch.setattr(sys, "stderr", quiet)
    monkeypatch.setattr(_compare._Progress, "DELAY", 0.0)
    assert not compare(looped, ZEROS, axis_name="i", executor="vectorized", progress=True) and quiet.text == []
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(_compare._Progress, "DELAY", 3600.0)  # a run shorter than the delay
    assert not compare(looped, ZEROS, axis_name="i", executor="vectorized", progress=True) and terminal.text == []


# -- under spmdsim compare --hosts H: each host compares its own devices, host 0 prints one report naming them ---
#
# 2 hosts of 2 devices. The script plants exp one ulp off on global device 3 (host 1's second device) and, with
# "pairwise", makes spmdsim fold sums pairwise: the psum of (1, 2**-24, 2**-24, 2**-24) over the 4 devices is 1 in
# rank order (XLA:CPU's) and (1 + 2**-24) + (2**-24 + 2**-24) = 1 + 2**-23 pairwise: 1 ulp, on every device.

HOST_SCRIPT = """
import sys
import jax, jax.numpy as jnp, numpy as np
import spmdsim
from spmdsim.primitives import _batch
from spmdsim.runtime import _runtime
from spmdsim.jax.evaluation import _registry

exp, stacked = _registry.PER_DEVICE["exp"], _registry.VECTORIZED["exp"]
def exp_off_on_device_3(x, **params):  # a test double: one ulp more on global device 3
    out = exp(x, **params)
    lane = _runtime.current_lane()
    return np.nextafter(out, np.float32(np.inf)) if lane is not None and " device 3 " in f" {lane.label}" else out
def stacked_off_on_device_3(x, **params):  # the same, in the vectorized executor (this host's devices stacked)
    out = np.array(stacked(x, **params))
    present = _batch.current_batch().present()
    if out.shape[0] == len(present) and 3 in present:
        k = list(present).index(3)
        out[k] = np.nextafter(out[k], np.float32(np.inf))
    return out
_registry.PER_DEVICE["exp"], _registry.VECTORIZED["exp"] = exp_off_on_device_3, stacked_off_on_device_3
if sys.argv[1:] == ["pairwise"]:
    spmdsim.set_reduction_order("pairwise")

v = np.array([1.0, 2.0**-24, 2.0**-24, 2.0**-24], np.float32)
mine = np.arange(2) + 2 * jax.process_index()  # this host's devices' rows (a pmap takes process-local data)
x = (v[:, None] * np.ones((4, 4), np.float32))[mine]
f = jax.pmap(lambda b: jax.lax.psum(b, "i") * jnp.exp(b * 0.0), "i")  # <- host line
print(jax.process_index(), f(x)[0, 0])
"""


@pytest.mark.skipif(pytest.importorskip("spmdsim.tools._launch").mpiexec_path() is None, reason="no mpiexec")
@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_the_command_under_hosts_compares_each_hosts_devices_and_host_0_reports_once(tmp_path, executor):
    pytest.importorskip("mpi4py")
    script, out = tmp_path / "prog.py", tmp_path / "report.json"
    script.write_text(HOST_SCRIPT)
    line = next(k for k, text in enumerate(HOST_SCRIPT.splitlines()) if text.endswith("# <- host line"))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(spmdsim.__file__))))
    done = subprocess.run([sys.executable, "-m", "spmdsim", "compare", "--hosts", "2", "--devices", "4", "--json",
                           str(out), "--executor", executor, str(script), "pairwise"], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path, start_new_session=True)
    assert done.returncode == 1, done.stdout + done.stderr  # 1: some equation differs
    assert done.stdout.count("equations that differ") == 1, done.stdout  # printed once, by host 0
    assert "on 2 hosts" in done.stdout and "host 1 device 3 [i=3]" in done.stdout, done.stdout
    document = json.loads(out.read_text())
    validate(document)
    assert document["hosts"] == 2
    found = {d["primitive"]: d for d in document["differences"]}
    assert set(found) == {"exp", "psum"}, done.stdout
    exp, psum = found["exp"], found["psum"]
    assert exp["devices"] == ["host 1 device 3 [i=3]"] and exp["hosts"] == [1] and exp["ulps"] == 1
    assert psum["devices"] == [f"host {d // 2} device {d} [i={d}]" for d in range(4)] and psum["hosts"] == [0, 1]
    assert psum["ulps"] == 1 and psum["absolute"] == 2.0**-23
    # each host compared its own 2 devices' equations: per device thread, 4 in all; vectorized, a step per host
    counts = (1, 4, 4, 4) if executor == "threads" else (1, 2, 2, 2)
    assert (exp["occurrences"], exp["evaluations"], psum["occurrences"], psum["evaluations"]) == counts
    assert all(f"prog.py:{line + 1}:" in d["site"] for d in (exp, psum)), done.stdout
    assert all(d["note"].startswith("not measured: under --hosts") for d in document["drift"]), document["drift"]
