"""One Ctrl-C ends a mapped call at once, whatever the devices do, and says where each device was.

Each case runs tests/_interrupt_program.py in a subprocess, sends SIGINT when device 3 starts to stall (it
says so on stdout) while the other devices wait in a psum, and checks what the process did. The cases run
concurrently (one module fixture runs them, six at a time), so the file costs a few seconds. The only time
bound is a generous one: the KeyboardInterrupt reaches the program within 5 s of the signal (spmdsim's grace
period is 0.5 s; the program reports the time, so a slow interpreter exit on a loaded machine does not count).
Everything else is an outcome that the machine's speed cannot change: a device stalled in C cannot stop within
the grace, so it is abandoned; a device looping in Python must end, stopped by the exception raised in its
thread (whether within the grace depends on when a loaded machine gives it the CPU, so that is not asserted);
with AFTER, device 3 stays blocked until the program has made its later calls.
"""
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import spmdsim

PROGRAM = os.path.join(os.path.dirname(__file__), "_interrupt_program.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(spmdsim.__file__)))
HAVE_JAX = __import__("importlib").util.find_spec("jax") is not None

CASES = [  # (front end, what device 3 does, thread scope, nested)
    ("numpy", "sleep", "default", "0"),
    ("numpy", "sleep", "reuse", "0"),
    ("numpy", "sleep", "fresh", "0"),
    ("numpy", "loop", "default", "0"),
    ("numpy", "loop", "reuse", "0"),
    ("numpy", "blocked", "default", "0"),
    ("numpy", "sleep", "default", "1"),
    ("numpy", "loop", "reuse", "1"),
    ("jax", "sleep", "default", "0"),
    ("jax", "loop", "reuse", "0"),
    ("jax", "sleep", "reuse", "1"),
]
AFTER_CASES = [("numpy", "blocked", "default", "0", "after"), ("numpy", "blocked", "fresh", "0", "after"),
               ("jax", "blocked", "default", "0", "after")]


def interrupt(args: tuple) -> dict:
    """Run the program, SIGINT it when device 3 stalls; returns its exit code, output and the seconds from
    the signal to its exit."""
    env = {**os.environ, "PYTHONPATH": ROOT, "SPMDSIM_IDLE_THREAD_SECONDS": "0.3", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, PROGRAM, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    first = proc.stdout.readline()
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    arrived = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("interrupted at ")]
    return {"rc": proc.returncode, "first": first, "out": out, "err": err,
            "seconds": arrived[0] - sent if arrived else float("inf")}


@pytest.fixture(scope="module")
def runs():
    cases = [c for c in CASES + AFTER_CASES if HAVE_JAX or c[0] != "jax"]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        return dict(zip(cases, pool.map(interrupt, cases)))


def label(nested: str) -> str:
    return "device {} [o=0, i={}]" if nested == "1" else "device {} [i={}]"


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_one_sigint_ends_the_call_with_keyboard_interrupt_and_the_device_table(case, runs):
    if case[0] == "jax" and not HAVE_JAX:
        pytest.skip("jax is not installed")
    run = runs[case]
    front, stall, scope, nested = case
    assert run["first"] == "stalling\n", run["err"]
    assert run["rc"] == -signal.SIGINT, run["err"]
    assert run["seconds"] < 5, f"KeyboardInterrupt came {run['seconds']:.1f} s after SIGINT:\n{run['err']}"
    err = run["err"]
    assert "KeyboardInterrupt" in err and "spmdsim: interrupted; where every device was:" in err, err
    table = err[err.index("where every device was:"):]
    assert f"{label(nested).format(3, 3)}  running" in table, table
    for d in (0, 7):
        row = next(line for line in table.splitlines() if line.startswith(label(nested).format(d, d)))
        assert "waiting" in row and "psum(" in row and "_interrupt_program.py:" in row, row
    if stall in ("sleep", "blocked"):    # busy in C: it (nested: the outer device) cannot stop within the grace
        assert "did not stop within 0.5 s" in err, err
    else:                                # looping in Python: the exception raised in its thread stopped it
        assert "device 3 stopped: True" in run["out"], run["out"] + err
    assert "user code ran after the interrupt" not in run["out"]
    assert "Exception in thread" not in err, err


@pytest.mark.parametrize("case", AFTER_CASES, ids="-".join)
def test_after_ctrl_c_an_abandoned_thread_never_runs_user_code_and_no_thread_is_left(case, runs):
    if case[0] == "jax" and not HAVE_JAX:
        pytest.skip("jax is not installed")
    run = runs[case]
    assert run["first"] == "stalling\n" and run["rc"] == 0, run["err"]
    report = json.loads(run["out"].strip().splitlines()[-1])
    assert report["abandoned"].count(True) == 1           # device 3, blocked in C when the grace ran out
    assert re.search(r"spmdsim: .*device 3 \[i=3\].* did not stop", "\n".join(report["notes"])), report["notes"]
    assert report["later_calls_ok"] and report["later_calls_threads"] >= 8
    assert report["reused_abandoned"] == []               # later calls ran on other threads
    assert report["abandoned_alive"] == []                # it ended when its wait returned
    assert report["spmdsim_threads_left"] == []           # and the parked ones after the idle time
    assert "user code ran after the interrupt" not in run["out"]
    assert "Exception in thread" not in run["err"], run["err"]


LOST_SIGNAL_PROGRAM = """
import os, signal, threading, time, numpy as np, spmdsim
from spmdsim import lax
looping, sent = threading.Event(), []
def helper():
    looping.wait()
    time.sleep(0.2)  # the caller is blocked in its wait by then (were it not, the signal would take the usual way)
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)  # delivered to this thread: every other one blocks SIGINT
threading.Thread(target=helper, daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # the device threads, started from here, block it too
def f(x):
    if lax.axis_index("i") == 0:
        looping.set()
        while True:
            pass
    return lax.psum(x, "i")
try:
    spmdsim.pmap(f, axis_name="i")(np.zeros(4))
except KeyboardInterrupt as e:
    print("interrupted", time.monotonic() - sent[0] < 5, "where every device was" in "\\n".join(e.__notes__))
"""


def test_a_ctrl_c_whose_handler_ran_while_the_caller_was_blocked_elsewhere_still_ends_the_call():
    """CPython raises a signal's exception in the main thread at its next bytecode boundary, and a blocking lock
    acquire has none: a SIGINT whose C handler ran just before the caller blocked in its wait for the devices (a
    loaded machine can preempt it there), or in another thread, was never raised, and the call hung with a device
    looping forever. Made certain here: the caller blocks SIGINT, so a helper thread takes it."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", LOST_SIGNAL_PROGRAM], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.stdout.splitlines() == ["interrupted True True"], proc.stdout + proc.stderr
