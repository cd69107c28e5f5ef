"""One name per collective in every view of a trace (issue 29, points 7 and 8): the name the user wrote (pmean
stays pmean; JAX's psum_invariant inside a jax.shard_map is psum) and its axes, in the events, the counts, the
summary, the Perfetto JSON and the SVG timeline (a colour per collective and axes); the timeline of a script with
two maps has a panel per map, its idle gaps cut and marked, and a time axis. The JAX cases run `spmdsim run` as a
subprocess (skipped without jax; this file never imports jax)."""
import json
import re
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import spmdsim
from spmdsim import lax
from spmdsim.tools._trace import CallEvent, _mapped_calls
from terminal import jax_installed, spmdsim_command
from test_pictures import SVG, legend, text_extent

needs_jax = pytest.mark.skipif(not jax_installed(), reason="needs jax")

MESH_KW = dict(in_specs=spmdsim.P("data", "model"), out_specs=spmdsim.P("data", "model"))


def layer(w):
    s = lax.psum(w, "model")
    m = lax.pmean(s, "data")
    return m + lax.all_gather(w, "model", tiled=True)[:w.shape[0]]


def traced_layer():
    mesh = spmdsim.make_mesh((2, 2), ("data", "model"))
    with spmdsim.trace(values="summary") as tr:
        spmdsim.shard_map(layer, mesh=mesh, **MESH_KW)(np.ones((4, 4), np.float32))
    return tr


def bars(root):
    """(fill, tooltip) of every collective bar of the timeline."""
    return [(r.get("fill"), r.find(SVG + "title").text) for r in root.iter(SVG + "rect")
            if r.find(SVG + "title") is not None and " step " in r.find(SVG + "title").text]


def test_events_counts_and_summary_carry_the_users_name_and_axis():
    tr = traced_layer()
    assert [(e.op, e.primitive, e.axis_name) for e in tr.events[::2]] == [
        ("psum", "psum", ("model",)), ("pmean", "psum", ("data",)), ("all_gather", "all_gather", ("model",))]
    assert tr.counts() == {"psum": 2, "pmean": 2, "all_gather": 2}
    pmean = tr.events[2]
    assert pmean.name == "pmean(data)" and pmean.results[0][0]["mean"] == 2.0   # the mean, not the sum
    rows = {(r["op"], r["axis"]): r["count"] for r in tr.summary_rows()}
    assert rows == {("psum", "model"): 2, ("pmean", "data"): 2, ("all_gather", "model"): 2}
    text = tr.summary(file=open("/dev/null", "w"))
    assert re.search(r"pmean\s+\S?\s*'data'", text) and re.search(r"psum\s+\S?\s*'model'", text)


def test_perfetto_events_carry_the_users_name_and_axis(tmp_path):
    tr = traced_layer()
    doc = tr.to_perfetto(tmp_path / "t.json")
    events = [e for e in doc["traceEvents"] if e.get("cat") == "collective"]
    assert {e["name"] for e in events} == {"psum(model)", "pmean(data)", "all_gather(model)"}
    pmean = next(e for e in events if e["name"] == "pmean(data)")
    assert pmean["args"]["collective"] == "pmean" and pmean["args"]["primitive"] == "psum"
    assert pmean["args"]["axis_name"] == ["data"]


def test_timeline_colours_each_collective_and_axis_apart():
    mesh = spmdsim.make_mesh((2, 2), ("data", "model"))
    with spmdsim.trace() as tr:
        spmdsim.shard_map(lambda w: lax.pmean(lax.psum(w, "model"), "data") + lax.psum(w, "data"), mesh=mesh,
                          **MESH_KW)(np.ones((4, 4), np.float32))
        spmdsim.shard_map(layer, mesh=mesh, **MESH_KW)(np.ones((4, 4), np.float32))
    root = ET.fromstring(tr.to_svg().svg)
    named = ["psum over 'model'", "pmean over 'data'", "psum over 'data'", "all_gather over 'model'"]
    assert legend(root) == ["a device's mapped call"] + [f"{n}: arrival to release" for n in named]
    swatches = {g.find(SVG + "text").text.split(":")[0]: g.find(SVG + "rect").get("fill")
                for g in root.iter(SVG + "g") if g.get("class") == "legend"}
    assert len(set(swatches.values())) == len(swatches)   # distinct colours, also for psum over two axes
    for fill, tooltip in bars(root):
        assert fill == swatches[tooltip.split(" step ")[0]], tooltip
    assert "invariant" not in tr.to_svg().svg


def two_maps_with_an_idle_gap(pause: float = 0.3):
    mesh = spmdsim.make_mesh((2, 2), ("data", "model"))
    with spmdsim.trace() as tr:
        for _ in range(2):
            spmdsim.pmap(lambda v: lax.pmean(v, "i"), axis_name="i")(np.ones((4, 3)))
        time.sleep(pause)   # what a script does between calls: JAX tracing, printing
        spmdsim.shard_map(layer, mesh=mesh, **MESH_KW)(np.ones((4, 4), np.float32))
    return tr


def test_timeline_of_two_maps_has_a_panel_each_with_the_idle_gap_cut_and_marked():
    tr = two_maps_with_an_idle_gap()
    root = ET.fromstring(tr.to_svg().svg)
    width = float(root.get("width"))
    texts = list(root.iter(SVG + "text"))
    headings = [t for t in texts if t.get("class") == "panel"]
    assert [t.text for t in headings] == ["4 devices over 'i': 2 mapped calls, 2 collectives",
                                          "4 devices over 'data', 'model': 1 mapped call, 6 collectives"]
    # Each panel's rows lie between its heading and the next: the two maps' devices are not interleaved.
    rows = [(float(t.get("y")), t.text) for t in texts if t.text.startswith("device ")]
    second = float(headings[1].get("y"))
    assert [label for y, label in rows if y < second] == [f"device {d} [i={d}]" for d in range(4)]
    assert [label for y, label in rows if y > second][:2] == ["device 0 [data=0, model=0]",
                                                             "device 1 [data=0, model=1]"]
    # The pause is cut out: a zigzag on the axis, labelled with its length; everything else is to scale.
    gaps = [g for g in root.iter(SVG + "g") if g.get("class") == "gap"]
    assert len(gaps) >= 1
    cut_ms = [float(m[1]) * {"us": 1e-3, "ms": 1, "s": 1e3}[m[2]]
              for m in (re.fullmatch(r"idle ([\d.]+) (us|ms|s) cut out", g.find(SVG + "title").text) for g in gaps)]
    assert max(cut_ms) >= 300
    assert any(g.find(SVG + "text") is not None for g in gaps)
    # The time axis: tick labels in increasing order, none overlapping, all inside the picture.
    axis_y = float(next(line.get("y1") for line in root.iter(SVG + "line") if line.get("class") == "time-axis"))
    ticks = sorted((float(t.get("x")), t) for t in texts if float(t.get("y")) == axis_y + 16)
    values = [float(t.text) for _, t in ticks]
    assert len(values) >= 3 and values == sorted(values) and values[-1] >= 300
    extents = [text_extent(t) for _, t in ticks]
    assert all(right < left for (_, right), (left, _) in zip(extents, extents[1:]))
    for t in texts:
        left, right = text_extent(t)
        assert 0 <= left and right <= width, t.text
    # The maps' bars: the collectives drawn in the panels, clear of the cut.
    assert len(bars(root)) == 2 * 4 + 6 * 2


def test_a_short_trace_is_drawn_to_scale_without_cuts():
    with spmdsim.trace() as tr:
        spmdsim.pmap(lambda v: lax.psum(v, "i"), axis_name="i")(np.ones(4))
    svg = tr.to_svg().svg
    assert 'class="gap"' not in svg and "zigzag" not in svg


def test_device_calls_group_into_mapped_calls():
    def call(d, start, end, axis="i"):
        return CallEvent(f"device {d} [{axis}={d}]", start, end, "returned")

    calls = [call(0, 0.0, 1e-4), call(1, 2e-4, 3e-4),                # one call: no overlap, but devices not yet seen
             call(0, 4e-4, 5e-4), call(1, 4.5e-4, 6e-4),             # device 0 again: the next call
             call(0, 1.0, 1.1, "j"), call(1, 1.0, 1.1, "j")]         # a second later, another map
    found = _mapped_calls(calls, [])
    assert [[c.device for c in m.devices] for m in found] == [
        ["device 0 [i=0]", "device 1 [i=1]"], ["device 0 [i=0]", "device 1 [i=1]"],
        ["device 0 [j=0]", "device 1 [j=1]"]]


def test_device_calls_group_by_the_runtimes_call_number_on_a_loaded_machine():
    """A device of a short call that starts late (a loaded machine: after the others ended and later than the
    heuristic's gap) stays in its call; the next call's devices, as early as they come, are the next call."""
    calls = [CallEvent("device 0 [i=0]", 0.0, 1e-5, "returned", call=7),
             CallEvent("device 1 [i=1]", 5e-3, 5.01e-3, "returned", call=7),     # 5 ms late, alone
             CallEvent("device 1 [i=1]", 5.02e-3, 5.03e-3, "returned", call=8),  # the next call, at once
             CallEvent("device 0 [i=0]", 5.04e-3, 5.05e-3, "returned", call=8)]
    found = _mapped_calls(calls, [])
    assert [[c.device for c in m.devices] for m in found] == [
        ["device 0 [i=0]", "device 1 [i=1]"], ["device 1 [i=1]", "device 0 [i=0]"]]


@needs_jax
def test_spmdsim_run_trace_of_a_jax_script_names_what_the_user_wrote(tmp_path):
    (tmp_path / "two_maps.py").write_text(JAX_SCRIPT)
    proc = spmdsim_command("run", "--devices", "4", "--trace", "t.json", "two_maps.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e.get("cat") == "collective"]
    assert {e["name"] for e in events} == {"pmean(i)", "psum(i)", "psum(model)", "pmean(data)", "all_gather(model)"}
    assert {e["args"]["primitive"] for e in events if e["name"] == "pmean(data)"} == {"psum"}
    assert "invariant" not in (tmp_path / "t.json").read_text()


@needs_jax
def test_spmdsim_run_timeline_of_a_jax_script_has_a_panel_per_map_and_cuts_its_gaps(tmp_path):
    (tmp_path / "two_maps.py").write_text(JAX_SCRIPT)
    proc = spmdsim_command("run", "--devices", "4", "--trace", "t.svg", "two_maps.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(tmp_path / "t.svg").getroot()
    headings = [t.text for t in root.iter(SVG + "text") if t.get("class") == "panel"]
    # the eager shard_map runs op by op, as JAX dispatches it: each of its 6 primitives is a mapped call
    assert headings == ["4 devices over 'i': 3 mapped calls, 6 collectives",
                        "4 devices over 'data', 'model': 6 mapped calls, 6 collectives"]
    assert any(g.get("class") == "gap" for g in root.iter(SVG + "g"))   # JAX traced between the calls
    assert legend(root) == ["a device's mapped call"] + [f"{n}: arrival to release" for n in (
        "pmean over 'i'", "psum over 'i'", "psum over 'model'", "pmean over 'data'", "all_gather over 'model'")]


JAX_SCRIPT = """import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

def step(x):
    return jax.lax.pmean(x, "i") + jax.lax.psum(x, "i")

x = jnp.arange(8.0).reshape(4, 2)
for _ in range(3):
    x = jax.pmap(step, axis_name="i")(x)

mesh = jax.make_mesh((2, 2), ("data", "model"))

def layer(w):
    return jax.lax.pmean(jax.lax.psum(w, "model"), "data") + jax.lax.all_gather(w, "model", tiled=True)[:2]

w = jax.device_put(jnp.ones((4, 4)), NamedSharding(mesh, P("data", "model")))
print(jax.shard_map(layer, mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))(w).sum())
"""
