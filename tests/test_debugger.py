"""The stepping debugger a teacher drives: breakpoints, continue N, expressions in a device's frame, legible
stops with several operands, stops at a would-hang or mismatch; `spmdsim debug` without jax."""
import re

import numpy as np
import pytest

import spmdsim
from spmdsim import lax
from spmdsim.debug import Breakpoint
from terminal import drive, jax_installed

LOOP = """import numpy as np
import spmdsim
from spmdsim import lax

def f(x):
    for k in range(3):
        x = lax.psum(x, 'i') / 4
        x = lax.ppermute(x + k, 'i', [(0, 1), (1, 2), (2, 3), (3, 0)])
    return lax.all_gather(x, 'i')

print('result', spmdsim.pmap(f, 'i')(np.arange(4.0))[0])
"""
# steps: psum 0, ppermute 1, psum 2, ppermute 3, psum 4, ppermute 5, all_gather 6 (lines 7, 8, 9)


def test_spmdsim_debug_runs_a_numpy_program_without_jax(tmp_path):
    (tmp_path / "prog.py").write_text(LOOP)
    out, code = drive(["-c", "import sys; sys.modules['jax'] = None; from spmdsim.cli import main; "
                             "sys.exit(main(sys.argv[1:]))", "debug", "prog.py", "--devices", "4"], ["c"], cwd=tmp_path)
    assert code == 0, out
    assert "stop 0: psum(float64[], axis_name='i') (step 0) at prog.py:7" in out
    assert "result [" in out and "the program finished" in out


def test_breakpoints_continue_n_print_and_unknown_commands(tmp_path):
    (tmp_path / "prog.py").write_text(LOOP)
    out, code = drive(["-m", "spmdsim", "debug", "-b", "psum", "prog.py", "--devices", "4"],
                      ["c 2",                       # psum hits at steps 2 and 4: stop at 4
                       "b ppermute step=5 device=3", "b prog.py:9", "b", "cl 1",
                       "c",                         # ppermute step 5
                       "p 2 x", "p 2 k * 100", "p 1 undefined_name", "p 9 x",
                       "zzz", "n 0",
                       "c",                         # all_gather (prog.py:9)
                       "n 1"], cwd=tmp_path)
    assert code == 0, out
    assert "spmdsim debug: prog.py; stopping at 'psum'." in out
    stops = re.findall(r"stop (\d+): (\w+)\(.*\(step (\d+)\)", out)
    assert stops == [("0", "psum", "0"), ("1", "psum", "4"), ("2", "ppermute", "5"), ("3", "all_gather", "6")]
    assert "breakpoint 2: ppermute step=5 device=3" in out and "breakpoint 3: prog.py:9" in out
    assert "1: psum (hit 3 times)" in out                   # the listing, before clearing it
    assert "deleted breakpoint 1 (psum)" in out
    assert "(spmdsim) p 2 k * 100\n200\n" in out            # device 2's loop variable at its call
    assert re.search(r"\(spmdsim\) p 2 x\n2\.5  \(float64\[\]\)\n", out)   # x, the operand less k
    assert "*** NameError: name 'undefined_name' is not defined" in out
    assert "*** device must be in 0..3" in out
    assert "*** unknown command 'zzz'; h lists the commands\n" in out
    assert "*** next N: N is a count of at least 1, got '0'" in out
    assert "s, show DEVICE" not in out                      # the help is not reprinted for a typo


def test_print_evaluates_in_each_device_frame_side_by_side_values():
    def f(x):
        local = x * 10
        return lax.psum(local, "i")

    s = spmdsim.debug.step(spmdsim.pmap(f, "i"), np.arange(4.0))
    assert [s.eval(d, "local + 1") for d in range(4)] == [1.0, 11.0, 21.0, 31.0]
    with pytest.raises(NameError):                          # a collective in an expression: no axis bound
        s.eval(0, "lax.psum(local, 'i')")
    stop = s.stop
    assert s.next() is None and s.result.tolist() == [60.0] * 4
    with pytest.raises(ValueError, match="released"):
        spmdsim.debug.evaluate(stop, 0, "local")


def test_a_stop_with_several_operands_is_one_block_per_operand_and_bounded_in_width():
    def f(x):
        grads = {"w": x * np.arange(100.0), "b": x}
        return lax.psum((x.sum(), grads), "i")

    s = spmdsim.debug.step(spmdsim.pmap(f, "i"), np.arange(8.0))
    text = s.stop.table()
    s.finish()
    assert "operand 2 of 3: float64[100]" in text
    assert "device 7 [i=7]  float64[100] [0, 7, 14, 21, …, 693]" in text
    assert max(len(line) for line in text.splitlines()[1:]) <= 100
    assert len(re.findall(r"^device 5 \[i=5\]", text, re.M)) == 3   # one row per device in each block


def test_session_breakpoints_and_continue_n():
    def f(x):
        for _ in range(4):
            x = lax.pmax(lax.psum(x, "i"), "i")
        return x

    s = spmdsim.debug.step(spmdsim.pmap(f, "i"), np.ones(2), breakpoints=["pmax"])
    assert (s.stop.op, s.stop.step) == ("pmax", 1)
    assert s.cont(2).step == 5                               # pmax hits at 3 and 5
    s.clear()
    assert s.next(2).step == 7 and s.stop.op == "pmax"
    assert s.cont() is None and s.result.tolist() == [16.0, 16.0]
    with pytest.raises(ValueError, match="did you mean 'psum'"):
        spmdsim.debug.step(spmdsim.pmap(f, "i"), np.ones(2), breakpoints=["psun"])


def test_breakpoint_text():
    bp = Breakpoint.parse("psum_scatter train.py:42 axis=batch step=3 device=2")
    assert (bp.op, bp.line, bp.axis, bp.step, bp.device) == ("psum_scatter", "train.py:42", "batch", 3, 2)
    assert bp.matches("reduce_scatter", ("batch",), 3, ["src/train.py:42"], ["device 2 [batch=2]"])
    assert not bp.matches("reduce_scatter", ("batch",), 3, ["src/train.py:42"], ["device 12 [batch=12]"])
    assert Breakpoint.parse("42").matches("psum", ("i",), 0, ["a.py:42"], ["device 0 [i=0]"])
    assert Breakpoint.parse("a.py:7").matches("psum", ("i",), 0, ["/x/a.py:7:11 (f)"], ["device 0 [i=0]"])  # JAX
    assert not Breakpoint.parse("a.py:7").matches("psum", ("i",), 0, ["b.py:7"], ["device 0 [i=0]"])
    for bad, message in [("step=x", "step must be a number"), ("color=red", "cannot read 'color=red'"),
                         ("train.py:x", "FILE:LINE or LINE"), ("", "empty")]:
        with pytest.raises(ValueError, match=message):
            Breakpoint.parse(bad)


def test_a_would_hang_stops_with_every_device_held_for_inspection(tmp_path):
    (tmp_path / "hang.py").write_text(
        "import numpy as np, spmdsim\nfrom spmdsim import lax\n\n"
        "def f(x):\n    mine = x + 100\n    if lax.axis_index('i') != 2:\n        return lax.psum(mine, 'i')\n"
        "    return mine\n\nprint(spmdsim.pmap(f, 'i')(np.arange(4.0)))\n")
    out, code = drive(["-m", "spmdsim", "debug", "hang.py", "--devices", "4"], ["where", "p 1 mine", "p 2 mine", "c"],
                      cwd=tmp_path)
    assert code == 1, out
    assert "stop 0: CollectiveDeadlockError: psum(float64[], axis_name='i') (step 0) can never complete" in out
    assert re.search(r"device 1 \[i=1\]\s+waiting\s+psum\(float64\[\]\)\s+'i'\s+0\s+hang.py:7", out)
    assert "every device is still where it was" in out
    assert "device 2 [i=2]: returned" in out                # `where`
    assert "(spmdsim) p 1 mine\n101.  (float64[])\n" in out            # a held device's variable
    assert "*** device 2 [i=2] has no Python frame held here" in out
    end = out.split("(spmdsim) c\n")[-1]                   # then the program ends with the error, said once
    assert "CollectiveDeadlockError: psum(float64[], axis_name='i') (step 0) can never complete" in end
    assert "(the full report is above)" in end and "state     collective" not in end


def test_a_mismatch_stops_the_session_and_then_raises():
    def f(x):
        if lax.axis_index("i") == 1:
            return lax.pmax(x, "i")
        return lax.psum(x, "i")

    s = spmdsim.debug.step(spmdsim.pmap(f, "i"), np.arange(3.0))
    assert isinstance(s.stop.error, spmdsim.CollectiveMismatchError) and s.stop.op == "CollectiveMismatchError"
    assert "stop 0: CollectiveMismatchError: devices called different collectives" in s.stop.table()
    assert s.eval(1, "x") == 1.0
    with pytest.raises(spmdsim.CollectiveMismatchError):
        s.finish()


@pytest.mark.skipif(not jax_installed(), reason="needs jax")
def test_spmdsim_debug_steps_a_jax_program_whose_devices_run_jaxprs(tmp_path):
    (tmp_path / "jprog.py").write_text("import jax, jax.numpy as jnp\n\ndef f(x):\n"
                                       "    return jax.lax.pmean({'a': x, 'b': 2 * x}, 'i')\n\n"
                                       "print(jax.pmap(f, axis_name='i')(jnp.arange(4.0)))\n")
    out, code = drive(["-m", "spmdsim", "debug", "jprog.py", "--devices", "4"], ["p 0 x", "c"], cwd=tmp_path,
                      env={"JAX_PLATFORMS": "cpu"})
    assert code == 0, out
    assert f"stop 0: psum(float32[], float32[], axis_name='i') (step 0) at {tmp_path / 'jprog.py'}:4" in out
    assert "operand 1 of 2: float32[]" in out
    assert "*** device 0 [i=0] has no Python frame held here" in out and "'b': Array([3., 3., 3., 3.]" in out
