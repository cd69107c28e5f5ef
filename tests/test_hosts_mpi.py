"""Hosts as MPI processes (``mpiexec -n H``, mpi4py and MPICH from the ``mpi`` extra; skipped without them): the
programs of test_hosts.py, each host a process with 2 devices, give what the spoofed hosts give, end as specified
in bounded time, and leave no process behind. (Killed hosts and Ctrl-C: conformance/test_multihost.py, through
``spmdsim run --hosts``.)"""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import spmdsim

import _host_programs as programs

pytest.importorskip("mpi4py")
from spmdsim.tools._launch import mpiexec_path  # noqa: E402

MPIEXEC = mpiexec_path()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "tests", "_host_programs.py")
TIMEOUT = 120  # only there to fail instead of hanging (a run takes ~2 s; far more on a loaded machine)
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install 'spmdsim[mpi]')")


def processes_with(marker: str) -> list[int]:
    """The pids of the processes whose command line contains ``marker`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def run_mpi(name: str, hosts: int, tmp_path) -> tuple:
    """``mpiexec -n HOSTS python _host_programs.py NAME OUT`` with 2 devices per host: what host 0 got, and the
    output. Fails (after killing them) when the processes run past TIMEOUT or outlive mpiexec."""
    out = tmp_path / f"{name}-{hosts}.pkl"
    env = {**os.environ, "SPMDSIM_NUM_DEVICES": str(2 * hosts),
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run([MPIEXEC, "-n", str(hosts), sys.executable, PROGRAMS, name, str(out)], env=env,
                              capture_output=True, text=True, timeout=TIMEOUT, start_new_session=True)
    except subprocess.TimeoutExpired:
        for pid in processes_with(str(out)):
            os.kill(pid, 9)
        pytest.fail(f"mpiexec -n {hosts} {name} ran past {TIMEOUT} s")
    left = processes_with(str(out))
    assert not left, f"processes left behind: {left}"
    assert out.exists(), f"host 0 wrote nothing; status {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    with open(out, "rb") as f:
        return pickle.load(f), proc


def spoofed(name: str, hosts: int):
    with spmdsim.set_device_count(2 * hosts):
        return programs.outcome(name, hosts)


@pytest.fixture(params=[2, 4], ids=lambda h: f"{h}hosts")
def hosts(request):
    return request.param


def test_training_over_mpi_hosts_gives_the_spoofed_and_one_process_numbers_bit_for_bit(hosts, tmp_path):
    results, proc = run_mpi("training", hosts, tmp_path)
    assert proc.returncode == 0, proc.stderr
    w, losses = programs.train(*programs.dataset(2 * hosts))
    assert len(results) == hosts
    for (host_w, host_losses), (spoof_w, spoof_losses) in zip(results, spoofed("training", hosts), strict=True):
        assert host_w.tobytes() == w.tobytes() == spoof_w.tobytes()
        assert host_losses.tobytes() == losses.tobytes() == spoof_losses.tobytes()


def test_process_allgather_broadcast_and_sync_over_mpi(hosts, tmp_path):
    results, proc = run_mpi("allgather", hosts, tmp_path)
    assert proc.returncode == 0, proc.stderr
    for got, expected in zip(results, spoofed("allgather", hosts), strict=True):
        (gathered, tiled, source), (e_gathered, e_tiled, e_source) = got, expected
        np.testing.assert_array_equal(gathered["x"], np.arange(3) + 10 * np.arange(hosts)[:, None])
        for a, b in [(gathered["x"], e_gathered["x"]), (gathered["s"], e_gathered["s"]), (tiled, e_tiled),
                     (source, e_source)]:
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_shard_map_on_process_local_data_over_mpi(tmp_path):
    results, proc = run_mpi("mesh_psum", 2, tmp_path)
    assert proc.returncode == 0, proc.stderr
    for got, expected in zip(results, spoofed("mesh_psum", 2), strict=True):
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)


def test_device_output_of_every_host_comes_out_in_global_device_order(tmp_path, capsys):
    _, proc = run_mpi("printing", 2, tmp_path)
    spoofed("printing", 2)
    assert proc.stdout == capsys.readouterr().out
    assert proc.stdout.splitlines()[2] == "host 1 device 2 [i=2] | v=10.0"


def test_a_mismatch_across_mpi_hosts_names_each_host_device_and_line(hosts, tmp_path):
    (kind, name, text), proc = run_mpi("mismatch", hosts, tmp_path)
    assert (kind, name) == ("error", "CollectiveMismatchError") and proc.returncode == 0
    assert text.splitlines()[0] == spoofed("mismatch", hosts)[2].splitlines()[0]
    assert "  host 0 device 0 [i=0]: psum(float64[], axis_name='i') at " in text
    assert "  host 1 device " in text and ": pmax(float64[], axis_name='i') at " in text
    assert "host 0 device 0 [i=0]  waiting  psum(float64[])" in text


def test_a_subset_deadlock_across_mpi_hosts_is_reported_with_every_hosts_devices(hosts, tmp_path):
    (kind, name, text), proc = run_mpi("subset_deadlock", hosts, tmp_path)
    assert (kind, name) == ("error", "CollectiveDeadlockError")
    last = 2 * hosts - 1
    expected = (f"psum(float64[], axis_name='i') (step 0) can never complete: host {hosts - 1} device {last} "
                f"[i={last}] returned without reaching it. On real hardware this program hangs.")
    assert text.splitlines()[0] == expected == spoofed("subset_deadlock", hosts)[2].splitlines()[0]
    assert f"host {hosts - 1} device {last} [i={last}]  returned" in text


def test_a_device_raising_on_an_mpi_host_ends_every_host_with_its_error(hosts, tmp_path):
    (kind, name, text), proc = run_mpi("raising", hosts, tmp_path)
    assert (kind, name) == ("error", "ValueError")
    last = 2 * hosts - 1
    assert f"spmdsim: raised on host {hosts - 1} device {last} [i={last}]." in text
    assert 'raise ValueError("bad block on the last device")' in text
    assert text.split("\n")[0] == spoofed("raising", hosts)[2].split("\n")[0] == "bad block on the last device"


def test_a_host_skipping_a_mapped_call_over_mpi(tmp_path):
    result, _ = run_mpi("host_finishes_early", 2, tmp_path)
    assert result[:2] == ("error", "CollectiveMismatchError")
    assert result[2].splitlines()[:3] == spoofed("host_finishes_early", 2)[2].splitlines()[:3]
