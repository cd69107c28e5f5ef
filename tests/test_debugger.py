"""The stepping debugger a teacher drives: breakpoints, continue N, expressions in a device's frame, legible
stops with several operands, stops at a would-hang or mismatch; `spmdsim debug` without jax."""
import re

import numpy as np
import pytest

import spmdsim
from spmdsim import lax
from spmdsim.debug import Breakpoint
from terminal import drive, jax_installed, spmdsim_command

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

HANG = """import numpy as np, spmdsim
from spmdsim import lax

def f(x):
    mine = x + 100
    if lax.axis_index('i') != 2:
        return lax.psum(mine, 'i')
    return mine

print(spmdsim.pmap(f, 'i')(np.arange(4.0)))
"""


def debug(tmp_path, name, source, commands, *options, env=None):
    """Write ``source`` to ``tmp_path/name`` and drive ``spmdsim debug [OPTIONS] NAME --devices 4`` through
    ``commands`` on a terminal; returns the output and exit status."""
    (tmp_path / name).write_text(source)
    return drive(["-m", "spmdsim", "debug", *options, name, "--devices", "4"], commands, cwd=tmp_path, env=env)


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
    assert "*** no device 9 at this stop: its devices are 0, 1, 2, 3" in out
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
    out, code = debug(tmp_path, "hang.py", HANG, ["where", "p 1 mine", "p 2 mine", "c"])
    assert code == 1, out
    assert "stop 0: CollectiveDeadlockError: psum(float64[], axis_name='i') (step 0) can never complete" in out
    assert re.search(r"device 1 \[i=1\]\s+waiting\s+psum\(float64\[\]\)\s+'i'\s+0\s+hang.py:7", out)
    assert "every device is still where it was" in out
    assert "device 2 [i=2]: returned" in out                # `where`
    assert "(spmdsim) p 1 mine\n101.  (float64[])\n" in out            # a held device's variable
    assert "*** device 2 [i=2] is not held at a collective (returned)" in out
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
    # jax.lax.pmean meets in a psum and divides after it: shown as the pmean it is, with the mean as its result
    assert f"stop 0: pmean(float32[], float32[], axis_name='i') (step 0) at {tmp_path / 'jprog.py'}:4" in out
    assert "operand 1 of 2: float32[]" in out
    assert re.search(r"device 3 \[i=3\]\s+3\.\s+1\.5\n", out) and re.search(r"device 3 \[i=3\]\s+6\.\s+3\.\n", out)
    assert "*** device 0 [i=0] runs a jaxpr (a JAX program): it has no Python variables to read. 's 0' shows its " \
           "operand and 's 0 r' its result." in out
    assert "'b': Array([3., 3., 3., 3.]" in out


SHARD_MAP = """import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2, 2), ("data", "model"))

def f(x):
    y = jax.lax.psum(x, "model")
    z = jax.lax.pmean(y, "data")
    return jax.lax.all_gather(z, "model", tiled=True)

x = jax.device_put(jnp.arange(8.0).reshape(4, 2), NamedSharding(mesh, P("data", "model")))
g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model")))
print(g(x).tolist())
"""


@pytest.mark.skipif(not jax_installed(), reason="needs jax")
@pytest.mark.parametrize("spec", ["psum", "psum_invariant"])
def test_a_breakpoint_by_the_name_written_stops_at_every_primitive_implementing_it(tmp_path, spec):
    out, code = debug(tmp_path, "sm.py", SHARD_MAP, ["c"] * 4, "-b", spec, env={"JAX_PLATFORMS": "cpu"})
    assert code == 0, out
    # the shard_map's psum binds psum_invariant, shown as the psum written; the pmean meets in a psum: both stop
    # (one stop per group of two devices), the all_gather does not
    stops = re.findall(r"stop \d+: (\w+)\(.*axis_name='(\w+)'", out)
    assert stops == [("psum", "model")] * 2 + [("pmean", "data")] * 2, out
    assert re.search(r"device 0 \[data=0, model=0\]\s+\[\[1\.\], \[5\.\]\]\s+\[\[5\.\], \[9\.\]\]\n", out), out  # the mean


def test_breakpoints_by_name_pmean_and_the_primitive_names():
    def f(x):
        return lax.pmean(lax.psum(x, "i"), "i")

    s = spmdsim.debug.step(spmdsim.pmap(f, "i"), np.arange(4.0), breakpoints=["pmean"])
    assert (s.stop.op, s.stop.step) == ("pmean", 1) and s.stop.results[0][0] == 6.0   # the mean of four 6s
    assert s.cont() is None
    for spec in ("psum_invariant", "all_gather_invariant", "ragged_all_to_all"):
        assert Breakpoint.parse(spec).op == spec
    assert Breakpoint.parse("psum").matches(("pmean", "psum"), ("i",), 0, ["a.py:1"], ["device 0 [i=0]"])
    assert not Breakpoint.parse("pmean").matches(("psum", "psum"), ("i",), 0, ["a.py:1"], ["device 0 [i=0]"])
    assert Breakpoint.parse("psum_invariant").matches("psum", ("i",), 0, ["a.py:1"], ["device 0 [i=0]"])


def test_debugging_a_module_inside_spmdsim_shows_its_source_lines(tmp_path):
    out, code = drive(["-m", "spmdsim", "debug", "-m", "spmdsim.demo", "--steps", "1", "--devices", "2"],
                      ["p 1 scale", "q"], cwd=tmp_path)
    assert code == 0, out                                   # q: as pdb's
    assert re.search(r"stop 0: pmean\(float64\[\], float64\[\], float64\[10\], axis_name='batch'\) \(step 0\) at "
                     r"\S*spmdsim/demo\.py:\d+\n", out), out
    assert "<unknown>" not in out
    assert "(spmdsim) p 1 scale\n0.0180" in out


def test_where_and_print_agree_on_each_device_and_the_hint_fits_a_numpy_program(tmp_path):
    out, code = debug(tmp_path, "hang.py", HANG,
                      ["where", "p 0 mine", "p 1 mine", "p 2 mine", "p 3 mine", "s 1", "where", "c"])
    assert code == 1, out
    assert "Inspect them (where, p DEVICE EXPR)" in out
    wheres = [block.split("\n(spmdsim)")[0].splitlines() for block in out.split("(spmdsim) where\n")[1:]]
    for lines in wheres:
        states = dict(line.split(": ", 1) for line in lines)
        for d in range(4):
            label = f"device {d} [i={d}]"
            answer = re.search(rf"\(spmdsim\) p {d} mine\n(.*)\n", out).group(1)
            if states[label].startswith("waiting in psum"):
                assert answer == f"{100 + d}.  (float64[])", (label, states[label], answer)
            else:                                            # the same state in both views
                assert answer.startswith(f"*** {label} is not held at a collective ({states[label]})"), answer
    assert "(spmdsim) s 1\ndevice 1 [i=1] operand at hang.py:7:\n101.\n" in out


@pytest.mark.skipif(not jax_installed(), reason="needs jax")
def test_a_would_hang_in_a_jax_program_hints_at_what_can_be_read(tmp_path):
    out, code = debug(tmp_path, "jhang.py",
                      "import jax, jax.numpy as jnp\n\ndef f(x):\n    local = x * 2\n    return jax.lax.cond("
                      "jax.lax.axis_index('i') < 2, lambda v: jax.lax.psum(v, 'i'), lambda v: v, local)\n"
                      "\nprint(jax.pmap(f, axis_name='i')(jnp.arange(4.0)))\n", ["p 1 local", "s 1", "s 2", "c"],
                      env={"JAX_PLATFORMS": "cpu"})
    assert code == 1, out
    assert "Inspect them (where; s DEVICE: the operand a waiting device holds)" in out
    assert "*** device 1 [i=1] runs a jaxpr (a JAX program): it has no Python variables to read. 's 1' shows its " \
           "operand." in out
    assert re.search(r"\(spmdsim\) s 1\ndevice 1 \[i=1\] operand at \S*jhang.py:5:\d+ \(.*\):\n2\.\n", out), out
    assert "*** at an error stop only a waiting device's operand can be shown; device 2 [i=2] is returned" in out


def test_ctrl_c_at_the_prompt_is_answered_as_pdb_does_and_never_ends_the_devices(tmp_path):
    out, code = debug(tmp_path, "prog.py", LOOP, ["\x03", "p 1 x", "\x03", "q"])
    assert code == 0, out
    assert out.count("--KeyboardInterrupt--\n(the program is held at this stop; Ctrl-C does not end it here: "
                     "type q to quit, c to run on)\n(spmdsim) ") == 2
    assert "(spmdsim) p 1 x\n1.  (float64[])\n" in out       # the stop goes on after a Ctrl-C
    assert "spmdsim debug: stopped (the user quit the spmdsim debugger)." in out
    assert "Traceback" not in out and "abandoned" not in out and "did not stop" not in out


def test_enter_repeats_the_last_command_and_up_recalls_it(tmp_path):
    out, code = debug(tmp_path, "prog.py", LOOP,
                      ["",                  # nothing to repeat yet: the prompt again
                       "n",                 # stop 1
                       "",                  # n again: stop 2
                       "p 3 k",
                       "\x1b[A\x1b[A\n",    # Up twice: n (the empty line is not history): stop 3
                       "\x1b[A\n",          # Up: n again: stop 4
                       "q"])
    assert code == 0, out
    stops = re.findall(r"stop (\d+): (\w+)\(", out)
    assert stops == [("0", "psum"), ("1", "ppermute"), ("2", "psum"), ("3", "ppermute"), ("4", "psum")], out
    assert "(spmdsim) p 3 k\n1\n" in out
    assert "unknown command" not in out


def test_breakpoint_in_every_device_gives_one_device_pdb_prompt_at_a_time(tmp_path):
    (tmp_path / "bp.py").write_text(
        "import numpy as np, spmdsim\nfrom spmdsim import lax\n\n"
        "def f(x):\n    mine = x * 10\n    breakpoint()\n    total = lax.psum(mine, 'i')\n    return total\n\n"
        "print(spmdsim.pmap(f, 'i')(np.arange(4.0)))\n")
    # the first device to prompt runs past the psum to line 8 (the others must reach it: they take their turns
    # meanwhile); `until 8`, not `n`: Python 3.13's pdb stops at the breakpoint() line itself, 3.11's at the next
    out, code = drive(["bp.py"], ["p mine", "until 8"] + ["p mine", "c"] * 3 + ["p total", "c"], cwd=tmp_path,
                      env={"SPMDSIM_NUM_DEVICES": "4"})
    assert code == 0, out
    answers = re.findall(r"\(Pdb device (\d) \[i=\1\]\) p (mine|total)\n(?:np\.float64|array)\(([\d.]+)\)\n", out)
    first = answers[0][0]
    assert sorted(d for d, what, _ in answers if what == "mine") == ["0", "1", "2", "3"], out
    assert all(float(v) == 10 * int(d) for d, what, v in answers if what == "mine"), out   # each to its device
    assert answers[-1] == (first, "total", "60."), out    # the first device, after its n over the psum
    assert all(line.count("(Pdb") <= 1 for line in out.splitlines()), out   # one prompt per line
    assert "[60. 60. 60. 60.]" in out


def test_a_breakpoint_past_the_end_of_its_file_is_refused(tmp_path):
    out, code = debug(tmp_path, "prog.py", LOOP, ["b prog.py:99", "b 12", "b 11", "b", "q"])
    assert "*** breakpoint 'prog.py:99': prog.py has 11 lines; line 99 is not one of them" in out
    assert "*** breakpoint '12': prog.py has 11 lines; line 12 is not one of them" in out   # LINE: the program's
    assert "breakpoint 1: 11\n" in out and "1: 11 (hit 0 times)" in out
    proc = spmdsim_command("debug", "-b", "prog.py:99", "prog.py", cwd=tmp_path)
    assert proc.returncode == 2 and "prog.py has 11 lines; line 99 is not one of them" in proc.stderr


# -- issue 41: one meaning of DEVICE, pdb's exit status, gdb's breakpoint report and continue N ------------

MESH = """import numpy as np, spmdsim
from spmdsim import P, lax

mesh = spmdsim.make_mesh((2, 2), ("x", "y"))

def f(b):
    return lax.psum(b * 10, "y")

print("result", spmdsim.shard_map(f, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", None))(np.arange(4.0).reshape(2, 2)))
"""


def test_p_and_s_take_the_device_id_as_b_device_does(tmp_path):
    # the psum over 'y' of a (2, 2) mesh meets twice: devices 0, 1 (x=0) and devices 2, 3 (x=1); device d holds
    # b = d, so its operand is 10 * d; the group of devices 2 and 3 sums 20 + 30 = 50
    out, code = debug(tmp_path, "mesh.py", MESH, ["p 3 b", "s 2 r", "s 3", "p 0 b", "c"], "-b", "device=3")
    assert code == 0, out
    assert re.search(r"stop 0: psum\(float64\[1, 1\], axis_name='y'\) \(step 0\) at mesh.py:7 \[breakpoint 1: "
                     r"device=3\]\n", out), out
    assert "(spmdsim) p 3 b\n[[3.]]  (float64[1, 1])\n" in out          # device 3, the stop's second row
    assert "(spmdsim) s 2 r\ndevice 2 [x=1, y=0] result at mesh.py:7:\n[[50.]]\n" in out
    assert "(spmdsim) s 3\ndevice 3 [x=1, y=1] operand at mesh.py:7:\n[[30.]]\n" in out
    assert "(spmdsim) p 0 b\n*** no device 0 at this stop: its devices are 2, 3\n" in out


def test_the_python_api_takes_device_ids_too():
    mesh = spmdsim.make_mesh((2, 2), ("x", "y"))
    f = spmdsim.shard_map(lambda b: lax.psum(b * 10, "y"), mesh=mesh, in_specs=spmdsim.P("x", "y"),
                          out_specs=spmdsim.P("x", None))
    s = spmdsim.debug.step(f, np.arange(4.0).reshape(2, 2), breakpoints=["device=2"])
    assert s.stop.devices == ["device 2 [x=1, y=0]", "device 3 [x=1, y=1]"]
    assert s.eval(3, "b").tolist() == [[3.0]] and s.stop.row(3) == 1
    with pytest.raises(ValueError, match="no device 1 at this stop: its devices are 2, 3"):
        s.eval(1, "b")
    assert s.finish().tolist() == [[10.0], [50.0]]


@pytest.mark.parametrize("key", ["q", "\x04"])          # q, and Ctrl-D on an empty line
def test_quitting_exits_with_status_0_as_pdb_does(tmp_path, key):
    out, code = debug(tmp_path, "prog.py", LOOP, [key])
    assert code == 0, out
    assert "spmdsim debug: stopped (the user quit the spmdsim debugger)." in out and "result [" not in out


def test_quitting_at_a_would_hang_exits_with_status_0(tmp_path):
    out, code = debug(tmp_path, "hang.py", HANG, ["q"])
    assert code == 0, out
    assert "stop 0: CollectiveDeadlockError" in out and "spmdsim debug: stopped" in out


def test_a_stop_says_which_breakpoints_it_was_hit_at(tmp_path):
    out, code = debug(tmp_path, "prog.py", LOOP, ["c"] * 6, "-b", "psum step=2", "-b", "8", "-b", "psum")
    assert code == 0, out
    heads = re.findall(r"^stop \d+: (\w+)\(.*\(step (\d+)\) at prog.py:\d+(.*)$", out, re.M)
    # psum at 0, ppermute 1 (line 8), psum 2 (breakpoints 1 and 3), ppermute 3, psum 4, ppermute 5
    assert heads[:4] == [("psum", "0", " [breakpoint 3: psum]"), ("ppermute", "1", " [breakpoint 2: 8]"),
                         ("psum", "2", " [breakpoint 1: psum step=2, breakpoint 3: psum]"),
                         ("ppermute", "3", " [breakpoint 2: 8]")], out


def test_continue_n_passes_over_the_breakpoint_stopped_at_as_gdb_does(tmp_path):
    # breakpoint 1 at every psum (steps 0, 2, 4), breakpoint 2 at the all_gather (step 6). At psum step 0,
    # 'c 3' ignores breakpoint 1 twice (steps 2 and 4): the next stop is breakpoint 2's. The N-th next hit of
    # any breakpoint (the old meaning) would have been psum step 4.
    out, code = debug(tmp_path, "prog.py", LOOP, ["c 3", "b", "c"], "-b", "psum", "-b", "all_gather")
    assert code == 0, out
    stops = re.findall(r"stop (\d+): (\w+)\(.*\(step (\d+)\)", out)
    assert stops == [("0", "psum", "0"), ("1", "all_gather", "6")], out
    assert "will ignore the next 2 hits of breakpoint 1 (psum)" in out
    assert "1: psum (hit 3 times)\n2: all_gather (hit 1 times)" in out


def test_continue_n_at_a_stop_of_no_breakpoint_is_ignored_as_gdb_does():
    def f(x):
        for _ in range(3):
            x = lax.pmax(lax.psum(x, "i"), "i")
        return x

    s = spmdsim.debug.step(spmdsim.pmap(f, "i"), np.ones(2))     # no breakpoint: stops at the first collective
    assert (s.stop.op, s.stop.breakpoints) == ("psum", [])
    s.break_at("pmax")
    assert s.cont(2).step == 1                                  # not at a breakpoint: 2 ignored; pmax step 1
    assert s.cont(2).step == 5                                  # at breakpoint 1: its hit at step 3 ignored
    assert [bp.hits for bp in s.breakpoints] == [3]
    assert s.cont() is None and s.result.tolist() == [8.0, 8.0]        # 1 doubled by each of three psums
