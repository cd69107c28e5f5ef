"""Spoofed hosts (spmdsim.run_hosts, a thread per host, no MPI, no jax): a mapped call made by the hosts is one
global call, with the numbers of one process, and the error reports name the hosts. The same programs run as MPI
processes in test_hosts_mpi.py."""
import inspect
import json
import re

import numpy as np
import pytest

import spmdsim
from spmdsim import P, lax, multihost

import _host_programs as programs


def line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("hosts", [2, 4])
def test_data_parallel_training_over_hosts_gives_the_one_process_numbers_bit_for_bit(hosts):
    results = spmdsim.run_hosts(hosts, programs.training)
    w, losses = programs.train(*programs.dataset(8))  # one process, the 8 devices, all the data
    assert len(results) == hosts
    for host_w, host_losses in results:
        assert host_w.tobytes() == w.tobytes() and host_losses.tobytes() == losses.tobytes()
    assert losses[-1] < losses[0]


def test_each_host_sees_its_index_its_devices_and_the_global_axis():
    def program():
        h = spmdsim.process_index()
        out = spmdsim.pmap(lambda v: (lax.axis_index("i"), lax.psum(v, "i"), lax.all_gather(v, "i")), "i")(
            np.arange(2.0) + 10 * h)
        return (h, spmdsim.process_count(), spmdsim.device_count(), spmdsim.local_device_count(),
                [(d.id, d.process_index) for d in spmdsim.local_devices()], out)

    results = spmdsim.run_hosts(4, program)
    for h, (index, count, n, local, devices, (axis_index, total, gathered)) in enumerate(results):
        assert (index, count, n, local) == (h, 4, 8, 2)
        assert devices == [(2 * h, h), (2 * h + 1, h)]
        assert axis_index.tolist() == [2 * h, 2 * h + 1]  # collectives span the global devices, host-major
        assert total.tolist() == [sum(range(2)) * 4 + 10 * (0 + 0 + 1 + 1 + 2 + 2 + 3 + 3)] * 2
        np.testing.assert_array_equal(gathered[0], np.repeat(np.arange(4) * 10.0, 2) + np.tile([0, 1], 4))
    assert spmdsim.process_index() == 0 and spmdsim.process_count() == 1 and spmdsim.device_count() == 8


def test_multihost_utils_gather_broadcast_and_synchronise_across_hosts():
    gathered, tiled, source = spmdsim.run_hosts(2, programs.allgather)[1]
    np.testing.assert_array_equal(gathered["x"], [[0, 1, 2], [10, 11, 12]])
    np.testing.assert_array_equal(gathered["s"], np.array([0, 1], np.float32))
    np.testing.assert_array_equal(tiled, [0.0, 1.0, 1.0, 2.0])
    np.testing.assert_array_equal(source, [1.5, 2.5])  # host 0's

    def unequal():
        multihost.assert_equal(np.arange(3) * spmdsim.process_index(), "weights differ")

    with pytest.raises(AssertionError, match="(?s)weights differ.*host 1 passed values that differ from host 0"):
        spmdsim.run_hosts(2, unequal)
    with pytest.raises(AssertionError, match=r"sync_global_devices name mismatch \('step 0'\)"):
        spmdsim.run_hosts(2, lambda: multihost.sync_global_devices(f"step {spmdsim.process_index()}"))


def test_shard_map_over_a_global_mesh_takes_and_returns_process_local_data():
    results = spmdsim.run_hosts(2, programs.mesh_psum)
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    x = np.arange(32.0).reshape(8, 4)
    f = spmdsim.shard_map(lambda b: (lax.psum(b, "x"), lax.all_gather(b, "x", tiled=True),
                                     lax.axis_index(("x", "y"))[None]),
                          mesh=mesh, in_specs=P("x", "y"), out_specs=(P(None, "y"), P(None, "y"), P(("x", "y"))))
    total, gathered, index = f(x)
    for h, (host_total, host_gathered, host_index) in enumerate(results):
        np.testing.assert_array_equal(host_total, total)  # replicated over x: whole on every host
        np.testing.assert_array_equal(host_gathered, gathered)
        np.testing.assert_array_equal(host_index, index[4 * h:4 * h + 4])  # split over (x, y): this host's part


def test_a_vmap_nested_in_a_hosts_pmap_reaches_across_hosts():
    def program():
        f = spmdsim.pmap(lambda v: spmdsim.vmap(lambda w: lax.psum(w, ("i", "j")), axis_name="j")(v), "i")
        return f(np.arange(8.0).reshape(4, 2) + 100 * spmdsim.process_index())

    results = spmdsim.run_hosts(2, program)
    expected = np.full((4, 2), np.arange(8.0).sum() * 2 + 100 * 8)
    for out in results:
        np.testing.assert_array_equal(out, expected)


def test_what_devices_print_comes_out_in_global_device_order(capsys):
    spmdsim.run_hosts(2, programs.printing)
    lines = capsys.readouterr().out.splitlines()
    first = [f"host {d // 4} device {d} [i={d}] | v={float(d % 4 + 10 * (d // 4))}" for d in range(8)]
    second = [f"host {d // 4} device {d} [i={d}] | sum=52.0" for d in range(8)]
    assert lines == first + second


def test_devices_of_different_hosts_calling_different_collectives_is_a_mismatch_naming_hosts_and_lines():
    kind, name, text = programs.outcome("mismatch", 2)
    assert (kind, name) == ("error", "CollectiveMismatchError")
    site = f"_host_programs.py:{line_of(programs.mismatch, 'lax.pmax')}"
    # the first of host 1's devices to reach the coordinator is the one named: any of them
    assert re.search(rf"  host 1 device [4-7] \[i=[4-7]\]: pmax\(float64\[\], axis_name='i'\) at \S*{site}\n", text)
    assert f"  host 0 device 0 [i=0]: psum(float64[], axis_name='i') at tests/{site}\n" in text


def test_a_collective_a_device_of_another_host_never_reaches_is_a_deadlock_with_every_hosts_devices():
    kind, name, text = programs.outcome("subset_deadlock", 2)
    assert (kind, name) == ("error", "CollectiveDeadlockError")
    assert "psum(float64[], axis_name='i') (step 0) can never complete: host 1 device 7 [i=7] returned without " \
           "reaching it" in text
    table = text.split("\n\n")[1].splitlines()
    assert [row.split()[:4] for row in table[2:]] == [["host", str(d // 4), "device", str(d)] for d in range(8)]


def test_a_device_that_raises_on_one_host_ends_every_host_with_its_error_host_device_and_line():
    outcomes = {}

    def program():
        try:
            programs.raising()
        except ValueError as e:
            outcomes[spmdsim.process_index()] = (str(e), e.__notes__)
            raise

    with pytest.raises(ValueError, match="bad block on the last device"):
        spmdsim.run_hosts(2, program)
    assert sorted(outcomes) == [0, 1]
    for message, notes in outcomes.values():
        assert message == "bad block on the last device"
        assert "spmdsim: raised on host 1 device 7 [i=7]." in notes
        assert any(n.startswith("spmdsim: traceback on host 1 device 7 [i=7]:") and "_host_programs.py" in n
                   and 'raise ValueError("bad block on the last device")' in n for n in notes)


def test_a_host_that_skips_a_mapped_call_the_others_make_is_reported_naming_it_and_the_line():
    kind, name, text = programs.outcome("host_finishes_early", 2)
    assert (kind, name) == ("error", "CollectiveMismatchError")
    lines = text.splitlines()
    assert lines[0] == "hosts took different steps as their 2nd:"
    site = "_host_programs.py:" + str(line_of(programs.host_finishes_early, ")(out)"))
    assert lines[1].startswith("  host 0: map over [i=8] (threads) at ") and lines[1].endswith(site)
    assert lines[2] == "  host 1: the end of its run_hosts function (returned)"


def test_hosts_taking_different_steps_is_a_mismatch_naming_each_hosts_step():
    def program():
        if spmdsim.process_index() == 1:
            mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
            return spmdsim.shard_map(lambda b: b, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(np.ones(2))
        return spmdsim.pmap(lambda v: v, "i")(np.ones(4))

    with pytest.raises(spmdsim.CollectiveMismatchError) as info:
        spmdsim.run_hosts(2, program)
    text = str(info.value)
    assert "hosts took different steps as their 1st:" in text
    assert "host 0: map over [i=8] (threads) at " in text and "host 1: map over [x=4, y=2] (threads) at " in text

    def skips_a_sync():
        if spmdsim.process_index() == 0:
            multihost.sync_global_devices("a")

    with pytest.raises(spmdsim.CollectiveMismatchError, match="host 1: the end of its run_hosts function"):
        spmdsim.run_hosts(2, skips_a_sync)


def test_the_trace_of_host_0_holds_every_host_with_a_process_track_per_host(tmp_path):
    traces = {}

    def program():
        with spmdsim.trace() as tr:
            spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(np.ones(2))
        traces[spmdsim.process_index()] = (tr, tr.to_perfetto(tmp_path / f"trace{spmdsim.process_index()}.json"))

    spmdsim.run_hosts(4, program)
    tr, doc = traces[0]
    assert len(tr.events) == 1 and tr.events[0].devices == tuple(f"host {d // 2} device {d} [i={d}]"
                                                                for d in range(8))
    assert sorted(c.device for c in tr.calls) == sorted(tr.events[0].devices)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {1: "host 0", 2: "host 1", 3: "host 2", 4: "host 3"}
    threads = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {(d // 2 + 1, f"host {d // 2} device {d} [i={d}]") for d in range(8)}
    assert json.loads((tmp_path / "trace0.json").read_text()) == doc
    assert all(traces[h][1] is None and not traces[h][0].events for h in (1, 2, 3))
    assert not (tmp_path / "trace1.json").exists()


def test_mistakes_are_value_errors_with_the_fix():
    with pytest.raises(ValueError, match="8 virtual devices cannot be split evenly over 3 hosts"):
        spmdsim.run_hosts(3, lambda: None)
    with pytest.raises(ValueError, match="must have leading axis size equal to the number of local devices.*"
                                         "axis_size=8, num_local_devices=4"):
        spmdsim.run_hosts(2, lambda: spmdsim.pmap(lambda v: v)(np.ones(8)))
    with pytest.raises(ValueError, match="set_device_count cannot be called in a multi-host run"):
        spmdsim.run_hosts(2, lambda: spmdsim.set_device_count(4))
    with pytest.raises(ValueError, match="hosts do not nest"):
        spmdsim.run_hosts(2, lambda: spmdsim.run_hosts(2, lambda: None))
    with pytest.raises(ValueError, match=r"\(x=2, y=3\) does not give each host a box"), \
            spmdsim.set_device_count(6):
        spmdsim.run_hosts(3, lambda: spmdsim.shard_map(lambda b: b, mesh=spmdsim.make_mesh((2, 3), ("x", "y")),
                                                       in_specs=P("x"), out_specs=P("x"))(np.ones(2)))


def test_ctrl_c_during_spoofed_hosts_ends_the_run_and_every_host_waiting_in_a_call():
    """A real SIGINT while host 0 waits in its mapped call for host 1 (busy in its own code): KeyboardInterrupt
    within seconds of the signal (run_hosts waits up to 1 s for each host thread; 5 s allowed, for a loaded
    machine), and host 0's thread has ended (its wait ended with the lost host). Host 1 sets off the signal
    itself, so the run is certainly under way when it comes, whatever the load."""
    import os
    import subprocess
    import sys
    program = """
import os, signal, threading, time, numpy as np, spmdsim
spmdsim.set_device_count(4)
sent = []
def interrupt():
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)
def fn():
    if spmdsim.process_index() == 1:
        threading.Timer(0.5, interrupt).start()  # host 0 is waiting in its call by then (if not, it ends as well)
        time.sleep(20)
    return spmdsim.pmap(lambda x: spmdsim.lax.psum(x, "i"), "i")(np.ones(2))
try:
    spmdsim.run_hosts(2, fn)
except KeyboardInterrupt:
    print("interrupted", time.monotonic() - sent[0] < 5)
print("left", sorted(t.name for t in threading.enumerate() if t.name.startswith("spmdsim host")))
os._exit(0)
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": root})
    assert proc.stdout.splitlines() == ["interrupted True", "left ['spmdsim host 1']"], proc.stdout + proc.stderr
