"""spmdsim.cost on JAX programs: FLOPs and bytes read from the maps' jaxprs (exact for dots and convolutions),
the fusion assumptions, loops, the groups and bytes of the collectives a shard_map or pmap really calls, the
Predictor watching a run, ``spmdsim run --hardware`` (its table and the predicted Perfetto track), and the
scaling book's examples that need a program ('gpus' Q7: adding two fp32 vectors on an H100). Predictions of
real sizes are made without running (``jax.ShapeDtypeStruct`` through ``spmdsim.cost.predict``)."""
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spmdsim.jax as sj
from spmdsim import cost
from spmdsim.cost import collectives as C
from spmdsim.jax.integration import _map

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S = jax.ShapeDtypeStruct


def only(report):
    assert len(report.predictions) == 1
    return report.predictions[0]


def ops(prediction, primitive):
    return [t for t in prediction.ops if t.op.primitive == primitive]


def test_a_bf16_matmul_has_exact_flops_and_turns_compute_bound_at_the_critical_batch():
    d, f = 8192, 8192

    def step(x, w):
        return x @ w

    def predicted(batch):
        run = sj.pmap(step, "i", in_axes=(0, None))
        return only(cost.predict(run, S((8, batch, d), jnp.bfloat16), S((d, f), jnp.bfloat16),
                                 hardware="tpu-v5e:2x4"))

    small, large = predicted(128), predicted(512)
    (dot,) = ops(small, "dot_general")
    assert dot.op.flops == 2 * 128 * d * f
    assert dot.op.bytes(False) == 2 * (128 * d + d * f + 128 * f)
    assert dot.bound == "memory" and ops(large, "dot_general")[0].bound == "compute"
    assert dot.intensity < cost.chip("tpu-v5e").critical_intensity < ops(large, "dot_general")[0].intensity
    assert large.mfu > 0.9  # one compute-bound dot (and no collective)


def test_convolution_flops():
    def step(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    p = only(cost.predict(sj.pmap(step, "i", in_axes=(0, None)), S((8, 4, 32, 32, 16), jnp.float32),
                          S((3, 3, 16, 64), jnp.float32), hardware="h100:8"))
    (conv,) = ops(p, "conv_general_dilated")
    assert conv.op.flops == 2 * (4 * 32 * 32 * 64) * (3 * 3 * 16)


def test_gpus_q7_adding_two_fp32_vectors_on_an_h100():
    """'gpus' Quiz 1 Q7: fp32[N] + fp32[N] reads and writes 12N bytes: 3.84ms for N = 2**30 (book's figure,
    12N / 3.35e12), about 0.23us for N = 65536."""
    for n, book in ((2 ** 30, 3.84e-3), (65536, 0.23e-6)):
        p = only(cost.predict(sj.pmap(lambda a, b: a + b, "i"), S((8, n), jnp.float32), S((8, n), jnp.float32),
                              hardware="h100:8"))
        (add,) = ops(p, "add")
        assert add.bound == "memory" and add.op.bytes(True) == 12 * n
        assert abs(add.time / book - 1) < 0.05


def test_fusion_keeps_an_elementwise_chain_on_chip():
    def step(x, w):
        h = x @ w
        return jnp.tanh(h * 2.0 + 1.0) @ w

    p = only(cost.predict(sj.pmap(step, "i", in_axes=(0, None)), S((8, 256, 1024), jnp.float32),
                          S((1024, 1024), jnp.float32), hardware="tpu-v5p:2x2x2"))
    mul, = ops(p, "mul")
    tanh, = ops(p, "tanh")
    assert mul.op.bytes(True) == 256 * 1024 * 4          # reads h from HBM, its result stays on chip
    assert tanh.op.bytes(True) == 256 * 1024 * 4         # writes the dot's operand to HBM
    assert mul.op.bytes(False) == 2 * 256 * 1024 * 4
    assert p.unfused_memory_bound + p.unfused_compute_bound > p.memory_bound + p.compute_bound


def test_a_scan_counts_its_trips_and_a_while_loop_is_noted():
    def body(c, _):
        return jnp.sin(c) @ jnp.eye(64), None

    def step(x):
        y, _ = jax.lax.scan(body, x, None, length=7)
        z = jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] * 2, c[1] + 1), (y, 0))[0]
        return z

    p = only(cost.predict(sj.pmap(step, "i"), S((8, 64, 64), jnp.float32), hardware="tpu-v5e:8"))
    dot, = ops(p, "dot_general")
    assert dot.op.count == 7 and dot.op.flops == 2 * 64 ** 3
    assert any("while loop" in n for n in p.cost.notes)


def test_shard_map_collectives_span_the_axes_they_name():
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    P = jax.sharding.PartitionSpec

    def f(a):
        g = jax.lax.all_gather(a, "y", tiled=True)           # over y: 4 devices
        s = jax.lax.psum(g, ("x", "y"))                     # over all 8
        r = jax.lax.ppermute(s, "x", [(0, 1), (1, 0)])      # x neighbours
        return jax.lax.psum_scatter(r, "y", tiled=True)

    fn = sj.shard_map(f, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))
    topo = cost.topology("tpu-v5e:4x2")  # the first torus axis is the fastest: 'y' (4) on it, 'x' (2) on the other
    p = only(cost.predict(fn, S((256, 1024), jnp.float32), hardware=topo))
    by = {t.op.primitive: t for t in p.ops if t.comm is not None}
    block = 128 * 256 * 4
    ag = by.get("all_gather") or by["all_gather_invariant"]
    assert ag.op.axes == ("y",) and ag.op.comm_bytes == 4 * block
    assert ag.time == pytest.approx(C.all_gather(topo, [0, 1, 2, 3], 4 * block).time)
    assert ag.comm.links == "ICI x:4"
    ps = by.get("psum") or by["psum_invariant"]
    assert sorted(ps.op.groups[0]) == list(range(8)) and ps.comm.links == "ICI x:4 y:2"
    assert ps.op.comm_bytes == 4 * block and ps.time == pytest.approx(C.all_reduce(topo, range(8), 4 * block).time)
    pp = by["ppermute"]
    assert (0, 4) in pp.op.pairs and pp.time == pytest.approx(C.ppermute(topo, [(0, 4)], 4 * block).time)
    rs = by["reduce_scatter"]
    assert rs.op.comm_bytes == 4 * block and rs.op.axes == ("y",)


def test_more_devices_than_chips_is_refused():
    with pytest.raises(ValueError, match="only 4 chips"):
        cost.predict(sj.pmap(lambda x: x, "i"), S((8, 4), jnp.float32), hardware="h100:4")


def test_the_predictor_watches_a_run_and_leaves_nothing_installed():
    before = _map.map_observer
    step = sj.pmap(lambda x, w: jax.lax.pmean(jnp.tanh(x @ w), "i"), "i", in_axes=(0, None))
    x, w = np.ones((8, 16, 32), np.float32), np.ones((32, 32), np.float32)
    with cost.predicting("tpu-v6e:2x4") as p:
        for _ in range(3):
            step(x, w)
    assert _map.map_observer is before
    (pred,) = p.predictions
    assert pred.calls == 3 and pred.cost.flops >= 2 * 16 * 32 * 32
    import io
    out = io.StringIO()
    text = p.report(file=out)
    for word in ("predicted on TPU v6e 2x4", "step, no overlap", "MFU", "peak memory per device", "slowest "
                 "collectives", "pmean", "test_cost_model_programs.py"):
        assert word in text, word


def test_a_map_body_is_analysed_once_whatever_the_calls(monkeypatch):
    """The analysis runs once per map body; each later call only counts (the overhead is measured in
    docs/cost_model.md, not asserted here)."""
    from spmdsim.cost import report

    step = sj.pmap(lambda x: jax.lax.psum(x * 2.0, "i"), "i")
    x = np.ones((8, 64), np.float32)
    step(x)
    analysed = []
    real = report.analyze
    monkeypatch.setattr(report, "analyze", lambda *a, **k: analysed.append(1) or real(*a, **k))
    with cost.predicting("tpu-v5e:2x4") as p:
        for _ in range(5):
            step(x)
    assert len(analysed) == 1 and p.predictions[0].calls == 5


SCRIPT = """import jax, jax.numpy as jnp
def step(x, w):
    return jax.lax.pmean(jnp.tanh(x @ w), "i")
f = jax.pmap(step, "i", in_axes=(0, None))
for _ in range(2):
    out = f(jnp.ones((8, 64, 128)), jnp.ones((128, 128)))
print("done", out.shape)
"""


def _run(*args, cwd):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "spmdsim", "run", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_spmdsim_run_hardware_prints_the_table_and_adds_the_predicted_track(tmp_path):
    (tmp_path / "s.py").write_text(SCRIPT)
    proc = _run("--hardware", "tpu-v5e:2x4", "--trace", "t.json", "s.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "done (8, 64, 128)" in proc.stdout
    err = proc.stderr
    assert "predicted on TPU v5e 2x4" in err and "(2 calls)" in err and "s.py:3" in err and "MFU" in err
    doc = json.loads((tmp_path / "t.json").read_text())
    names = [e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"]
    assert "predicted on TPU v5e 2x4" in names
    predicted = [e for e in doc["traceEvents"] if e.get("cat") == "predicted"]
    assert any(e["name"] == "dot_general" for e in predicted) and any(e["name"] == "pmean" for e in predicted)
    calls = [e for e in doc["traceEvents"] if e.get("cat") == "call"]
    steps = [e for e in predicted if e["name"].startswith("pmap")]
    assert len(steps) == 2 and min(e["ts"] for e in steps) >= min(e["ts"] for e in calls) - 1


def test_spmdsim_run_with_an_unknown_chip_is_a_one_line_error(tmp_path):
    (tmp_path / "s.py").write_text(SCRIPT)
    proc = _run("--hardware", "tpu-v9:8", "s.py", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("spmdsim run: error: --hardware tpu-v9:8")
    assert len(proc.stderr.strip().splitlines()) == 1
