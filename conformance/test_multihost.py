"""Multi-host JAX under ``spmdsim run --hosts H`` (H MPI processes with 2 devices each; skipped without the
``mpi`` extra): the training example gives one process's numbers and real JAX multi-process's (gloo on loopback),
jax.process_index and multihost_utils work, and every way a multi-host job goes wrong ends as specified, in
bounded time, with no process left."""
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from spmdsim.tools._launch import mpiexec_path  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "jax", "multihost_train.py")
CASES = os.path.join(ROOT, "conformance", "_multihost_cases.py")
TIMEOUT = 120
pytestmark = pytest.mark.skipif(mpiexec_path() is None, reason="no mpiexec (pip install 'spmdsim[mpi]')")
ENV = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}


def processes_with(marker: str) -> list[int]:
    """The pids of the processes whose command line contains ``marker`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def no_process_left(marker: str) -> None:
    """Every process of the run has ended (polled: the deadline is only there to fail instead of hanging)."""
    deadline = time.monotonic() + 30
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = processes_with(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def unlabelled(out: str) -> list[str]:
    """The lines of hosts' output without their labels: under ``--hosts`` every line a host writes starts with
    ``host h | `` (asserted here, for each line); mpiexec's own lines (``[mpiexec@machine] ...``) are left out."""
    lines = [line for line in out.splitlines() if not line.startswith("[mpiexec@")]
    assert all(re.match(r"host \d+ \| ", line) for line in lines), out
    return [line.split(" | ", 1)[1] for line in lines]


def spmdsim_run(*args, hosts: int | None = None, devices: int = 4, env=None) -> subprocess.CompletedProcess:
    """``python -m spmdsim run [--hosts H] --devices N ARGS``, bounded; afterwards no process of the run (those
    naming its script) may be left."""
    command = [sys.executable, "-m", "spmdsim", "run", "--devices", str(devices),
               *(["--hosts", str(hosts)] if hosts else []), *args]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env or ENV, timeout=TIMEOUT)
    finally:
        no_process_left(next(a for a in args if a.endswith(".py")))  # the script names the run's processes
    return proc


def line_of(path: str, text: str) -> int:
    """The number of the first line of ``path`` that contains ``text``."""
    with open(path) as f:
        return next(n for n, line in enumerate(f, 1) if text in line)


def load(prefix, hosts: int) -> list[dict]:
    return [dict(np.load(f"{prefix}.{h}.npz")) for h in range(hosts)]


@pytest.mark.parametrize("hosts", [2, 4])
def test_multihost_training_gives_the_one_process_numbers_bit_for_bit(hosts, tmp_path):
    proc = spmdsim_run(EXAMPLE, "--out", str(tmp_path / "hosts"), hosts=hosts, devices=2 * hosts)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    # each host prints its line once, labelled with the host that printed it (as device lines are with devices)
    assert [line.split(": loss")[0] for line in lines] == [f"host {h} | host {h} of {hosts} (2 of {2 * hosts} devices)"
                                                           for h in range(hosts)]
    assert len({line.split(": loss")[1] for line in lines}) == 1  # every host's losses are the global ones
    one = spmdsim_run(EXAMPLE, "--out", str(tmp_path / "one"), devices=2 * hosts)  # one process, every shard
    assert one.returncode == 0, one.stderr
    single = load(tmp_path / "one", 1)[0]
    for h, results in enumerate(load(tmp_path / "hosts", hosts)):
        for key in ("w", "losses"):
            assert results[key].tobytes() == single[key].tobytes(), (h, key)
        np.testing.assert_array_equal(results["gathered"], np.stack([single["w"]] * hosts))
        assert results["from_host_0"] == np.float32(7)
    firsts = load(tmp_path / "hosts", hosts)[0]["hosts_first_rows"]
    assert len(np.unique(firsts, axis=0)) == hosts  # every host loaded its own shard


def test_the_vectorized_executor_across_hosts_gives_the_same_numbers(tmp_path):
    threads = spmdsim_run(EXAMPLE, "--out", str(tmp_path / "threads"), hosts=2)
    vectorized = spmdsim_run(EXAMPLE, "--out", str(tmp_path / "vectorized"), "--executor", "vectorized", hosts=2)
    assert threads.returncode == vectorized.returncode == 0, vectorized.stderr
    for a, b in zip(load(tmp_path / "threads", 2), load(tmp_path / "vectorized", 2), strict=True):
        for key in a:
            assert a[key].tobytes() == b[key].tobytes(), key


def real_jax_and_spmdsim(script: str, tmp_path) -> tuple[list[dict], list[dict]]:
    """``script`` on real JAX, 2 processes x 2 CPU devices (jax.distributed.initialize, gloo on loopback), and
    under spmdsim run --hosts 2 (where initialize only checks its arguments): each host's saved results."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_COORDINATOR": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2"}
    real = [subprocess.Popen([sys.executable, script, "--out", str(tmp_path / "real")],
                             env={**env, "JAX_PROCESS_ID": str(h)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for h in range(2)]
    try:
        for p in real:
            _, err = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, err
    finally:
        for p in real:
            p.kill()
            p.communicate()
    sim = spmdsim_run(script, "--out", str(tmp_path / "sim"), hosts=2,
                      env={**ENV, "JAX_COORDINATOR": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2"})
    assert sim.returncode == 0, sim.stderr
    return load(tmp_path / "real", 2), load(tmp_path / "sim", 2)


def test_same_training_script_same_numbers_as_real_jax_multi_process_with_gloo(tmp_path):
    """Data moved between hosts is equal bit for bit; values also computed outside the collectives within
    float32 rounding (XLA's own reductions)."""
    for r, s in zip(*real_jax_and_spmdsim(EXAMPLE, tmp_path), strict=True):
        assert set(r) == set(s)
        for key in ("hosts_first_rows", "from_host_0"):
            assert r[key].dtype == s[key].dtype and r[key].tobytes() == s[key].tobytes(), key
        for key in ("w", "losses", "gathered"):
            assert r[key].dtype == s[key].dtype
            np.testing.assert_allclose(s[key], r[key], rtol=2e-6, atol=1e-7, err_msg=key)
        np.testing.assert_array_equal(s["gathered"], np.stack([s["w"]] * 2))


def test_shard_map_on_global_arrays_from_process_local_data_same_as_real_jax_bit_for_bit(tmp_path):
    """make_array_from_process_local_data over a (hosts, devices) mesh, a jitted shard_map with psums over
    both axes and over one, process_allgather of global and process-local values: every host's results equal
    real JAX multi-process's bit for bit (shapes and dtypes included)."""
    script = os.path.join(ROOT, "examples", "jax", "multihost_shard_map.py")
    real, sim = real_jax_and_spmdsim(script, tmp_path)
    for r, s in zip(real, sim, strict=True):
        assert set(r) == set(s) == {"shape", "total", "centred", "per_host", "host_rows"}
        for key in r:
            assert r[key].dtype == s[key].dtype and r[key].shape == s[key].shape, key
            assert r[key].tobytes() == s[key].tobytes(), key
    assert sim[0]["shape"].tolist() == [16, 3]


@pytest.mark.parametrize("hosts", [2, 4])
def test_a_mismatch_across_hosts_names_each_call_and_line(hosts):
    proc = spmdsim_run(CASES, "mismatch", hosts=hosts, devices=2 * hosts)
    assert proc.returncode == 1
    assert "spmdsim.errors.CollectiveMismatchError: devices called different collectives at step 0" in proc.stderr
    psum_line, pmax_line = line_of(CASES, 'jax.lax.psum(v, "i")'), line_of(CASES, 'jax.lax.pmax(v, "i")')
    assert re.search(rf"host \d device (\d) \[i=\1\]: psum\(float32\[\], axis_name='i'\) at "
                     rf"\S*_multihost_cases.py:{psum_line}:", proc.stderr)
    assert re.search(rf"host 1 device [23] \[i=[23]\]: pmax\(float32\[\], axis_name='i'\) at "
                     rf"\S*_multihost_cases.py:{pmax_line}:", proc.stderr)
    assert proc.stderr.count("CollectiveMismatchError: devices called") == hosts  # every host raises it


@pytest.mark.parametrize("hosts", [2, 4])
def test_a_subset_deadlock_across_hosts_has_the_table_of_every_device(hosts):
    proc = spmdsim_run(CASES, "deadlock", hosts=hosts, devices=2 * hosts)
    last = 2 * hosts - 1
    assert proc.returncode == 1
    assert (f"CollectiveDeadlockError: psum(float32[], axis_name='i') (step 0) can never complete: host "
            f"{hosts - 1} device {last} [i={last}] returned without reaching it.") in proc.stderr
    assert f"host {hosts - 1} device {last} [i={last}]  returned" in proc.stderr
    assert proc.stderr.count("can never complete") == hosts


@pytest.mark.parametrize("hosts", [2, 4])
def test_a_device_raising_on_one_host_ends_every_host_with_its_error_and_line(hosts):
    proc = spmdsim_run(CASES, "raising", hosts=hosts, devices=2 * hosts)
    last = 2 * hosts - 1
    assert proc.returncode == 1
    assert proc.stderr.count(f"ValueError: device {last} found a bad value") == hosts
    assert proc.stderr.count(f"spmdsim: raised on host {hosts - 1} device {last} [i={last}].") == hosts
    assert "_multihost_cases.py\", line " in proc.stderr and "in check" in proc.stderr


@pytest.mark.parametrize("hosts", [2, 4])
def test_a_killed_host_ends_every_other_host_within_5_seconds_naming_it(hosts):
    """Each other host's program gets the HostLostError within 5 s of the kill (a dead process on this machine is
    seen within 0.1 s); the time is taken where the error arrives, so that the slow exit of JAX processes on a
    loaded machine does not count; then every process ends (bounded by TIMEOUT) and none is left."""
    command = [sys.executable, "-m", "spmdsim", "run", "--devices", str(2 * hosts), "--hosts", str(hosts), CASES,
               "killed"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        no_process_left(CASES)
    said = unlabelled(out)
    killed_at = float(next(line for line in said if line.startswith("killing at")).split()[-1])
    lost = {line.split()[1]: float(line.split()[-1]) for line in said if " lost a host at " in line}
    assert sorted(lost) == sorted(str(h) for h in range(hosts) if h != 1), out + err
    assert max(lost.values()) - killed_at < 5.0, lost
    assert proc.returncode != 0
    assert err.count("spmdsim.errors.HostLostError: host 1 (process ") == hosts - 1
    assert "died; every host stops" in err


def test_a_host_that_ends_its_program_early_is_a_deadlock_naming_it():
    proc = spmdsim_run(CASES, "late", hosts=2)
    assert proc.returncode == 1
    assert "CollectiveDeadlockError: the 2nd step of the hosts (map over [i=4] (threads), at " in proc.stderr
    assert "host 1 finished its program without reaching it" in proc.stderr
    assert "host 1  finished after 1 step (returned)" in proc.stderr


def test_ctrl_c_on_the_launcher_stops_every_host():
    """One Ctrl-C reaches every host's program within 5 s (timed where the KeyboardInterrupt arrives, not at the
    exit of JAX processes, slow on a loaded machine), and the hosts end by themselves: the launcher's fallback
    (a second Ctrl-C to mpiexec for hosts still running 10 s later, which makes MPICH abort them and say
    "Ctrl-C caught") never comes."""
    command = [sys.executable, "-m", "spmdsim", "run", "--devices", "4", "--hosts", "2", CASES, "sleeping"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline().strip() == "host 0 | waiting"
        time.sleep(0.5)
        sent = time.time()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        no_process_left(CASES)
    assert proc.returncode == 130
    assert err.count("KeyboardInterrupt") >= 2
    interrupted = {line.split()[1]: float(line.split()[-1]) for line in unlabelled(out) if " interrupted at " in line}
    assert sorted(interrupted) == ["0", "1"], out + err
    assert max(interrupted.values()) - sent < 5.0, interrupted
    assert "Ctrl-C caught" not in out, out


def test_trace_of_a_multihost_run_has_a_process_track_per_host(tmp_path):
    import json
    path = tmp_path / "trace.json"
    proc = spmdsim_run("--trace", str(path), EXAMPLE, hosts=2)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {1: "host 0", 2: "host 1"}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(1, "host 0 device 0 [batch=0]"), (1, "host 0 device 1 [batch=1]"),
                       (2, "host 1 device 2 [batch=2]"), (2, "host 1 device 3 [batch=3]"),
                       # multihost_utils' own calls, over its (processes, local_devices) mesh
                       (1, "host 0 device 0 [processes=0, local_devices=0]"),
                       (1, "host 0 device 1 [processes=0, local_devices=1]"),
                       (2, "host 1 device 2 [processes=1, local_devices=0]"),
                       (2, "host 1 device 3 [processes=1, local_devices=1]")}
    pmeans = [e for e in events if e["ph"] == "X" and e["name"] == "pmean(batch)"]   # named as the script calls it
    assert len(pmeans) == 5 * 2 * 4  # 5 steps, the two pmeans, 4 devices


def test_a_host_gone_before_a_step_others_reach_at_different_times_is_named_on_every_host():
    proc = spmdsim_run(CASES, "gone", hosts=3, devices=3)
    assert proc.returncode == 1
    assert proc.stderr.count("CollectiveDeadlockError: the 1st step of the hosts (map over [i=3] (threads), at ") == 2
    assert proc.stderr.count("host 1 finished its program without reaching it") == 2
    assert "host 1  finished after 0 steps (returned)" in proc.stderr
    assert "KeyError" not in proc.stderr


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_a_mapped_call_over_part_of_the_hosts_devices_is_a_value_error(executor):
    proc = spmdsim_run("--executor", executor, CASES, "submesh", hosts=2)
    assert proc.returncode == 1
    assert proc.stderr.count("ValueError: a top-level mapped call in a multi-host run spans every host's devices "
                             "(2 hosts x 2 local devices = 4), but this one's mesh (i=2) has 2.") == 2


def test_jit_and_grad_around_a_pmap_across_hosts():
    """Host h passes [10h, 10h + 1]: the psum over the 4 devices is 22, plus each device's global axis index;
    the gradient of the sum over every host's outputs of psum(u * u) is 4 devices x 2u."""
    proc = spmdsim_run(CASES, "transforms", hosts=2)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["host 0 | host 0: [22.0, 23.0] [0.0, 8.0]",
                                                "host 1 | host 1: [24.0, 25.0] [80.0, 88.0]"]


def test_jax_distributed_initialize_checks_its_arguments_against_the_run():
    proc = spmdsim_run(CASES, "initialize", hosts=2)
    assert proc.returncode == 1
    assert "ValueError: jax.distributed.initialize(num_processes=3), but spmdsim runs 2 hosts" in proc.stderr


def test_bytes_that_are_not_a_message_end_the_job_and_run_nothing(tmp_path):
    """Host 1 sends host 0 a pickle whose loading would run a command (what any writer to the channel could send
    when messages were pickled): host 0 reports it as a malformed message from host 1, every host stops, the
    command never runs."""
    script = os.path.join(ROOT, "conformance", "_multihost_garbage.py")
    marker = tmp_path / "ran"
    proc = spmdsim_run(script, str(marker), hosts=2)
    assert proc.returncode != 0
    assert not marker.exists()
    assert "HostLostError: malformed message from host 1: it does not start with b'SPMD'" in proc.stderr, proc.stderr
    assert "spmdsim bug" not in proc.stderr and "host 0:" not in proc.stdout


def _listening(pid: int) -> list[tuple[str, int, bool]]:
    """The TCP sockets process ``pid`` listens on, as its network namespace sees them: (address, port, whether
    that namespace has devices other than loopback). From /proc: its socket inodes, /proc/PID/net/tcp{,6}."""
    import ipaddress
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
        with open(f"/proc/{pid}/net/dev") as f:
            devices = {line.split(":")[0].strip() for line in f.readlines()[2:]}
    except OSError:  # it ended meanwhile
        return []
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.readlines()[1:]:
                fields = row.split()
                if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                    continue
                raw, port = fields[1].split(":")
                words = [bytes.fromhex(raw[i:i + 8])[::-1] for i in range(0, len(raw), 8)]
                found.append((str(ipaddress.ip_address(b"".join(words))), int(port, 16), devices != {"lo"}))
    return found


def _process_tree(root: int) -> list[int]:
    children: dict = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                pass
    tree = [root]
    for pid in tree:
        tree.extend(children.get(pid, []))
    return tree


def test_a_one_machine_run_listens_on_nothing_but_loopback(tmp_path):
    """While the hosts of `spmdsim run --hosts 2` run (after a psum across them), every TCP socket any process of
    the job listens on is on a loopback address, or in a network namespace whose only device is loopback (MPICH's
    launcher binds the wildcard address; spmdsim runs the job in a namespace of its own where the system allows
    it): nothing of the job can be reached from another machine or, through the network, by another user."""
    script = tmp_path / "listening_hosts.py"
    script.write_text("import time, jax, numpy as np\n"
                      "print(jax.pmap(lambda v: jax.lax.psum(v, 'i'), 'i')(np.ones(2)), flush=True)\n"
                      "time.sleep(3)\n")
    command = [sys.executable, "-m", "spmdsim", "run", "--devices", "4", "--hosts", "2", str(script)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert re.fullmatch(r"host [01] \| \[4\. 4\.\]", proc.stdout.readline().strip())
        pids = _process_tree(proc.pid)
        sockets = {(pid, *s) for pid in pids for s in _listening(pid)}
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        no_process_left(str(script))
    assert proc.returncode == 0, err
    assert len(pids) >= 5  # the launcher, mpiexec, its proxy, and each host's two processes
    import ipaddress
    exposed = [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback and s[3]]
    assert not exposed, f"listening where others can reach: {exposed}"


def test_each_host_labels_its_own_lines_whole(tmp_path):
    """What the program prints on every host appears once per host, each line starting with the host that wrote
    it (issue 41): a line printed in pieces stays one line, on stdout and stderr alike, and a last line without
    its newline still comes out (at exit)."""
    script = tmp_path / "printing_hosts.py"
    script.write_text("import sys, jax\n"
                      "h = jax.process_index()\n"
                      "print('from', end=' '); print(f'host {h}')\n"
                      "print(f'err {h}', file=sys.stderr)\n"
                      "print('unfinished', end='')\n")
    proc = spmdsim_run(str(script), hosts=2)
    assert proc.returncode == 0, proc.stderr
    body = [line for line in proc.stdout.splitlines() if "spmdsim run:" not in line]
    assert sorted(body) == ["host 0 | from host 0", "host 0 | unfinished", "host 1 | from host 1",
                            "host 1 | unfinished"]
    assert sorted(line for line in proc.stderr.splitlines() if "err" in line) == ["host 0 | err 0",
                                                                                  "host 1 | err 1"]
