"""Debugging collectives: trace and timeline, stepping debugger (API and terminal), ordered output,
would-hang report, reduction orders (pictures: test_pictures.py)."""
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import spmdsim
from spmdsim import lax
from terminal import drive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def program(x):
    y = lax.psum(x, "i")                                   # step 0
    z = lax.ppermute(y + x, "i", [(0, 1), (1, 2), (2, 3), (3, 0)])   # step 1
    return lax.all_gather(z, "i")                          # step 2


# -- trace ------------------------------------------------------------------------------------------------

def test_trace_records_each_collective_in_order_with_sites_and_values():
    x = np.arange(4 * 2, dtype=np.float32).reshape(4, 2)
    with spmdsim.trace(values="summary") as tr:
        spmdsim.pmap(program, axis_name="i")(x)
    assert [e.op for e in tr.events] == ["psum", "ppermute", "all_gather"]
    assert [e.step for e in tr.events] == [0, 1, 2]
    psum = tr.events[0]
    assert psum.axis_name == ("i",) and psum.axis_size == 4 and psum.shapes == ((2,),) and psum.dtypes == ("float32",)
    assert psum.nbytes == 8
    assert psum.devices == tuple(f"device {d} [i={d}]" for d in range(4))
    assert all(site.endswith(f"test_debugging.py:{program.__code__.co_firstlineno + 1}") for site in psum.sites)
    assert all(a <= psum.released for a in psum.arrived) and psum.wait >= 0
    assert psum.operands[2][0]["mean"] == pytest.approx(x[2].mean())
    assert psum.results[0][0]["max"] == pytest.approx(x.sum(0).max())
    assert tr.events[1].params["perm"] == ((0, 1), (1, 2), (2, 3), (3, 0))
    assert sorted(c.device for c in tr.calls) == [f"device {d} [i={d}]" for d in range(4)]
    assert all(c.outcome == "returned" and c.start <= c.end for c in tr.calls)
    assert tr.counts() == {"psum": 1, "ppermute": 1, "all_gather": 1}


def test_trace_full_values_are_copies():
    x = np.arange(4.0)
    with spmdsim.trace(values="full") as tr:
        spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(x)
    assert [o[0].item() for o in tr.events[0].operands] == [0.0, 1.0, 2.0, 3.0]
    assert [r[0].item() for r in tr.events[0].results] == [6.0] * 4
    with pytest.raises(ValueError, match="values"):
        with spmdsim.trace(values="everything"):
            pass


def test_summary_table():
    with spmdsim.trace() as tr:
        spmdsim.pmap(lambda v: lax.psum(lax.psum(v, "i"), "i"), "i")(np.zeros((4, 3)))
    rows = tr.summary_rows()
    assert len(rows) == 1 and rows[0]["op"] == "psum" and rows[0]["count"] == 2 and rows[0]["bytes"] == 2 * 24
    assert rows[0]["worst_wait_ms"] <= rows[0]["total_wait_ms"]
    text = tr.summary(file=open(os.devnull, "w"))
    assert "psum" in text and "slowest device" in text


def test_perfetto_file_is_trace_event_json_with_one_track_per_device(tmp_path):
    with spmdsim.trace() as tr:
        spmdsim.pmap(program, axis_name="i")(np.zeros((4, 2), np.float32))
    path = tmp_path / "trace.json"
    tr.to_perfetto(path)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert sorted(threads.values()) == [f"device {d} [i={d}]" for d in range(4)]
    for tid in threads:
        mine = [e for e in events if e.get("tid") == tid and e["ph"] == "X"]
        assert [e["name"] for e in mine if e["cat"] == "collective"] == ["psum(i)", "ppermute(i)", "all_gather(i)"]
        assert sum(e["cat"] == "call" for e in mine) == 1
        assert all(e["dur"] > 0 and "site" in e["args"] for e in mine if e["cat"] == "collective")
    flows = [e for e in events if e["ph"] in "stf"]
    assert sorted({e["id"] for e in flows}) == [0, 1, 2]
    for k in range(3):
        phases = [e["ph"] for e in flows if e["id"] == k]
        assert phases == ["s", "t", "t", "f"]


def test_timeline_svg(tmp_path):
    with spmdsim.trace() as tr:
        spmdsim.pmap(program, axis_name="i")(np.zeros((4, 2), np.float32))
    tr.to_svg(tmp_path / "t.svg")
    root = ET.parse(tmp_path / "t.svg").getroot()
    rects = root.findall("{http://www.w3.org/2000/svg}rect")
    assert len(rects) >= 1 + 4 + 3 * 4            # background, calls, one bar per device per collective


# -- ordered output ----------------------------------------------------------------------------------------

def test_device_output_is_labelled_and_released_in_device_order_at_each_rendezvous(capsys):
    def f(x):
        i = int(lax.axis_index("i"))
        time.sleep(0.01 * (3 - i))         # later devices print first in time
        print(f"before {i}")
        y = lax.psum(x, "i")
        print(f"after {i}")
        return y

    spmdsim.pmap(f, "i")(np.zeros(4))
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"device {i} [i={i}] | before {i}" for i in range(4)] + \
                    [f"device {i} [i={i}] | after {i}" for i in range(4)]


def test_ordered_output_can_be_turned_off(capsys):
    with spmdsim.set_ordered_output(False):
        spmdsim.pmap(lambda x: print("plain") or x)(np.zeros(2))
    assert capsys.readouterr().out == "plain\nplain\n"


# -- would-hang report -------------------------------------------------------------------------------------

def test_would_hang_report_is_a_table_of_every_device():
    def f(x):
        i = lax.axis_index("i")
        if i == 1:
            raise_later = lax.pmax(x, "i")
            return raise_later
        return lax.psum(x, "i")

    with pytest.raises(spmdsim.CollectiveMismatchError) as info:
        spmdsim.pmap(f, "i")(np.zeros(3))
    text = str(info.value)
    assert "device          state    collective       axis  step  source line" in text
    assert "pmax(float64[]" in text and "psum(float64[]" in text   # in the table or the mismatch lines


# -- reduction orders ----------------------------------------------------------------------------------

def reference_sum(blocks, order):
    """An independent NumPy statement of each order, element by element."""
    blocks = [np.asarray(b) for b in blocks]
    n = len(blocks)
    if order == "sequential":
        out = blocks[0]
        for b in blocks[1:]:
            out = out + b
        return out
    if order == "pairwise":
        level = blocks
        while len(level) > 1:
            nxt = [level[k] + level[k + 1] for k in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return level[0]
    flat = [b.ravel() for b in blocks]
    out = np.empty_like(flat[0])
    for c, piece in enumerate(np.array_split(np.arange(flat[0].size), n)):
        for e in piece:
            acc = flat[(c + 1) % n][e]
            for k in range(2, n + 1):
                acc = acc + flat[(c + k) % n][e]
            out[e] = acc
    return out.reshape(blocks[0].shape)


@pytest.mark.parametrize("order", ["sequential", "pairwise", "ring"])
@pytest.mark.parametrize("n", [3, 5, 8])
def test_reduction_orders_match_a_numpy_statement_of_each(order, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((n, 11)) * 10.0 ** rng.integers(-5, 6, (n, 11))).astype(np.float32)
    with spmdsim.set_reduction_order(order):
        out = spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(x)
    expected = reference_sum(list(x), order)
    assert out.dtype == np.float32
    assert out[0].tobytes() == expected.tobytes()


@pytest.mark.parametrize("order", ["sequential", "pairwise", "ring"])
@pytest.mark.parametrize("n", [2, 3, 8, 13])
@pytest.mark.parametrize("block", [(2, 5), (40,)])   # 3 groups: 30 elements per rank (accumulated), 120 (a list)
def test_the_vectorized_executors_stacked_fold_is_each_orders_fold(order, n, block):
    """fold_stacked (the vectorized psum: every group's n blocks stacked on axis 1; in the sequential order
    one accumulate for small blocks) gives, per group, the fold of that order."""
    from spmdsim.primitives._reduction import ACCUMULATE_MAX_ELEMENTS, fold_stacked
    assert 3 * 10 <= ACCUMULATE_MAX_ELEMENTS < 3 * 40
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((3, n, *block)) * 10.0 ** rng.integers(-5, 6, (3, n, *block))).astype(np.float32)
    with spmdsim.set_reduction_order(order):
        out = fold_stacked(np.add, x)
    assert out.shape == (3, *block) and out.dtype == np.float32 and not out.flags.writeable
    for g in range(3):
        assert out[g].tobytes() == reference_sum(list(x[g]), order).tobytes()


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.bool_, np.float16, np.complex64])
def test_the_stacked_fold_keeps_the_dtype_wraps_and_propagates_nan(dtype):
    from spmdsim.primitives._reduction import fold_stacked
    x = (np.arange(3 * 6 * 4).reshape(3, 6, 4) * 53).astype(dtype)   # int8/uint16 sums wrap
    if np.dtype(dtype).kind in "fc":
        x[1, 2, 3] = np.nan
    for ufunc in (np.add, np.maximum, np.minimum):
        out = fold_stacked(ufunc, x)
        expected = x[:, 0]
        for k in range(1, 6):
            expected = ufunc(expected, x[:, k])   # bool + bool is or; int8 wraps
        assert out.dtype == np.dtype(dtype) and out.tobytes() == expected.tobytes(), ufunc
    wide = np.full((1, 4, 1), 100, np.int8)
    assert fold_stacked(np.add, wide)[0, 0] == np.int8(-112)   # 400 wraps to 400 - 512


@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.complex64])
def test_large_blocks_fold_chunk_by_chunk_as_the_whole_arrays_fold(dtype):
    """Blocks of a million elements and more are folded a cache-sized chunk at a time, the chunks spread over
    the CPUs: every element gets the same additions in the same order (overflow wraps, NaN and inf stay), bit
    for bit the fold of the whole arrays; a strided block takes the plain path."""
    from spmdsim.primitives import _reduction
    rng = np.random.default_rng(5)
    blocks = [(rng.standard_normal((3, 400_001)) * 3e4).astype(dtype) for _ in range(5)]
    if np.dtype(dtype).kind in "fc":
        blocks[1][0, :3] = [np.nan, np.inf, -np.inf]
        blocks[3][2, -1] = -0.0
    assert blocks[0].size >= _reduction._FOLD_LARGE
    for ufunc in (np.add, np.maximum):
        expected = blocks[0]
        for b in blocks[1:]:
            expected = ufunc(expected, b)
        got = _reduction.fold(ufunc, blocks)
        assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes() and not got.flags.writeable
        strided = _reduction.fold(ufunc, [b[:, ::2] for b in blocks])
        assert strided.tobytes() == np.ascontiguousarray(expected[:, ::2]).tobytes()


def test_stacked_fold_of_bfloat16_accumulates_in_float32_unless_told():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from spmdsim.primitives._reduction import fold_stacked
    x = np.full((1, 8, 1), 1 / 3, dtype=ml_dtypes.bfloat16)
    x[0, 0] = 256
    exact = np.float32(256) + 7 * np.float32(x[0, 1, 0])
    assert float(fold_stacked(np.add, x)[0, 0]) == float(ml_dtypes.bfloat16(exact))
    with spmdsim.set_reduction_order("sequential", accumulation_dtype=ml_dtypes.bfloat16):
        assert float(fold_stacked(np.add, x)[0, 0]) == 256.0   # rounded after every addition
    with spmdsim.set_reduction_order("sequential", accumulation_dtype=np.float64):
        y = np.array([1e8, 1.0, -1e8, 1.0, 3.0, 1e-3, -3.0, 7.0], np.float32).reshape(1, 8, 1)
        assert fold_stacked(np.add, y).dtype == np.float32
        assert float(fold_stacked(np.add, y)[0, 0]) == pytest.approx(9.001, rel=1e-6)


def test_orders_really_differ_and_accumulation_dtype():
    x = np.array([1e8, 1.0, -1e8, 1.0, 3.0, 1e-3, -3.0, 7.0], np.float32)   # the README's worked example
    sums = {}
    for order in ("sequential", "pairwise", "ring"):
        with spmdsim.set_reduction_order(order):
            sums[order] = float(spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(x)[0])
    assert len(set(sums.values())) == 3
    with spmdsim.set_reduction_order("sequential", accumulation_dtype=np.float64):
        wide = spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(x)
    assert wide.dtype == np.float32 and float(wide[0]) == pytest.approx(9.001, rel=1e-6)
    assert spmdsim.current_reduction_order().order == "sequential"
    with pytest.raises(ValueError, match="must be one of"):
        spmdsim.set_reduction_order("random")


def test_bfloat16_summed_in_float32_by_default_as_xla_cpu_does():
    ml_dtypes = pytest.importorskip("ml_dtypes")   # comes with jax
    x = np.full(8, 1 / 3, dtype=ml_dtypes.bfloat16)
    x[0] = 256
    default = spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(x)
    with spmdsim.set_reduction_order("sequential", accumulation_dtype=ml_dtypes.bfloat16):
        narrow = spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(x)   # rounded after every addition
    exact = np.float32(256) + 7 * np.float32(x[1])
    assert default.dtype == narrow.dtype == ml_dtypes.bfloat16
    assert float(default[0]) == float(ml_dtypes.bfloat16(exact)) != float(narrow[0]) == 256.0


# -- stepping debugger -------------------------------------------------------------------------------------

def test_debugger_api_steps_through_every_rendezvous():
    x = np.arange(4.0)
    session = spmdsim.debug.step(spmdsim.pmap(program, axis_name="i"), x)
    stops = [session.stop]
    while (stop := session.next()) is not None:
        stops.append(stop)
    assert [s.description.split("(")[0] for s in stops] == ["psum", "ppermute", "all_gather"]
    assert [float(o[0]) for o in stops[0].operands] == [0, 1, 2, 3]
    assert [float(r[0]) for r in stops[0].results] == [6.0] * 4
    assert [float(r[0]) for r in stops[1].results] == [9.0, 6.0, 7.0, 8.0]
    assert all("held at psum" in line for line in stops[0].state)
    assert "device 2 [i=2]" in stops[0].table() and session.finished
    np.testing.assert_array_equal(session.result, spmdsim.pmap(program, axis_name="i")(x))


def test_debugger_continue_and_quit():
    f = spmdsim.pmap(program, axis_name="i")
    s = spmdsim.debug.step(f, np.arange(4.0))
    assert s.cont() is None                                # no breakpoint set: runs to the end
    np.testing.assert_array_equal(s.result, f(np.arange(4.0)))
    s = spmdsim.debug.step(f, np.arange(4.0))
    s.quit()
    assert isinstance(s.error, spmdsim.debug.DebuggerQuit) and s.result is None


def test_terminal_debugger_through_a_pseudo_terminal(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import numpy as np\nimport spmdsim\nfrom spmdsim import lax\n\n"
                      "def f(x):\n    y = lax.psum(x, 'i')\n    return lax.ppermute(y * x, 'i', [(0, 1), (1, 2), (2, 3), (3, 0)])\n\n"
                      "print('result', spmdsim.pmap(f, 'i')(np.arange(4.0)))\n")
    out, code = drive(["-m", "spmdsim", "debug", str(script), "--devices", "4"],
                       ["help", "show 2", "n", "show 1 result", "where", "c"])
    assert code == 0, out
    assert "stop 0: psum(float64[], axis_name='i') (step 0)" in out
    assert re.search(r"device 2 \[i=2\] operand at \S*prog.py:6:\n2\.\n", out)
    assert "stop 1: ppermute(" in out
    assert re.search(r"device 1 \[i=1\] result at \S*prog.py:7:\n0\.\n", out)
    assert "device 3 [i=3]: held at ppermute" in out
    assert "result [18.  0.  6. 12.]" in out and "the program finished" in out
    assert "s, show DEVICE [operand|result]" in out          # help text


def test_terminal_debugger_quit(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import numpy as np, spmdsim\nprint(spmdsim.pmap(lambda v: spmdsim.lax.psum(v, 'i'), 'i')(np.ones(2)))\n")
    out, code = drive(["-m", "spmdsim", "debug", str(script)], ["q"])
    assert code == 0 and "stopped" in out and "[2. 2.]" not in out     # pdb's q exits with 0 too


# -- breakpoint() ------------------------------------------------------------------------------------------

def test_breakpoint_inside_a_device_talks_to_the_terminal(tmp_path):
    script = tmp_path / "bp.py"
    script.write_text("import numpy as np, spmdsim\nfrom spmdsim import lax\n\n"
                      "def f(x):\n    secret = x * 7\n    if lax.axis_index('i') == 1:\n        breakpoint()\n"
                      "    return lax.psum(secret, 'i')\n\nprint('result', spmdsim.pmap(f, 'i')(np.arange(3.0)))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONBREAKPOINT"}
    proc = subprocess.run([sys.executable, str(script)], input="p secret\nc\n", capture_output=True, text=True,
                          env={**env, "PYTHONPATH": ROOT}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "(Pdb device 1 [i=1]) np.float64(7.0)" in proc.stdout
    assert "result [21. 21. 21.]" in proc.stdout
