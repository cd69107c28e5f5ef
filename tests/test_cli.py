"""The `spmdsim` command as a newcomer types it: one-line errors, --version, help texts, `run` and `debug`
with options after the script and `-m MODULE`, `conformance -k`. Run as subprocesses; those that need jax
are skipped without it (this file never imports jax)."""
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import spmdsim
from spmdsim.tools._script import Program, split_argv
from spmdsim.cli import UsageError
from terminal import ROOT, drive, jax_installed, spmdsim_command

needs_jax = pytest.mark.skipif(not jax_installed(), reason="needs jax")

JAX_SCRIPT = """import sys
import jax, jax.numpy as jnp
print("argv", sys.argv[1:])
print("sum", jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(jnp.arange(4.0)))
"""


def one_line_error(proc, command: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{command}: error: ") and "Traceback" not in proc.stderr, \
        proc.stderr
    return lines[0]


def test_version():
    proc = spmdsim_command("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"spmdsim {spmdsim.__version__}"


def test_an_unknown_command_says_what_was_wrong():
    line = one_line_error(spmdsim_command("dmeo"), "spmdsim")
    assert "unknown command 'dmeo' (did you mean 'demo'?); the commands are demo, run, debug, conformance" in line
    assert "usage" not in spmdsim_command("frobnicate").stderr


def test_demo_with_zero_devices_is_a_one_line_error():
    line = one_line_error(spmdsim_command("demo", "--devices", "0"), "spmdsim demo")
    assert "argument --devices: expected a positive integer, got 0" in line


def test_debug_of_a_missing_script_is_a_one_line_error_without_jax(tmp_path):
    line = one_line_error(spmdsim_command("debug", "nonexist.py", cwd=tmp_path, no_jax=True), "spmdsim debug")
    assert f"no such script: 'nonexist.py' (looked in {tmp_path})" in line
    line = one_line_error(spmdsim_command("debug", "-m", "no_such_module", cwd=tmp_path, no_jax=True), "spmdsim debug")
    assert "no module named 'no_such_module'" in line


def test_run_without_jax_says_how_to_install_it():
    line = one_line_error(spmdsim_command("run", "x.py", no_jax=True), "spmdsim run")
    assert 'python -m pip install "spmdsim[jax]"' in line


@needs_jax
def test_run_of_a_missing_script_is_a_one_line_error(tmp_path):
    line = one_line_error(spmdsim_command("run", "nonexist.py", cwd=tmp_path), "spmdsim run")
    assert "no such script: 'nonexist.py'" in line
    line = one_line_error(spmdsim_command("run", "--trace", "t.txt", "nonexist.py", cwd=tmp_path), "spmdsim run")
    assert "--trace t.txt: expected a path ending in .json (a Perfetto trace) or .svg (a timeline picture)" in line


@pytest.mark.parametrize("command", ["demo", "debug", "conformance",
                                     pytest.param("run", marks=needs_jax)])
def test_help_shows_the_script_and_no_markup(command):
    proc = spmdsim_command(command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "``" not in proc.stdout and ":func:" not in proc.stdout
    if command in ("run", "debug"):
        assert f"usage: spmdsim {command} [options] SCRIPT.py [args]" in proc.stdout
        assert f"spmdsim {command} [options] -m MODULE [args]" in proc.stdout


def test_top_level_help():
    proc = spmdsim_command("--help")
    assert proc.returncode == 0 and "spmdsim --version" in proc.stdout and "debug" in proc.stdout
    assert spmdsim_command().returncode == 2


def test_split_argv():
    valued = ("--devices", "--trace")
    assert split_argv(["--devices", "4", "s.py", "--lr", "1", "--trace", "t.json", "--", "--devices", "9"], valued) \
        == (["--devices", "4", "--trace", "t.json"], Program("s.py", None, ("--lr", "1", "--devices", "9")))
    assert split_argv(["-m", "pkg.mod", "--devices=3", "-v"], valued) == (["--devices=3"],
                                                                          Program(None, "pkg.mod", ("-v",)))
    assert split_argv(["--", "-weird.py", "a"], valued) == ([], Program("-weird.py", None, ("a",)))
    assert split_argv(["--devices", "4"], valued) == (["--devices", "4"], None)
    with pytest.raises(UsageError, match="-m needs a module name"):
        split_argv(["-m"], valued)


def test_debug_runs_a_module_with_m_and_passes_its_arguments(tmp_path):
    (tmp_path / "mymod.py").write_text(
        "import sys, numpy as np, spmdsim\nprint('argv', sys.argv[1:])\n"
        "print('sum', spmdsim.pmap(lambda x: spmdsim.lax.psum(x, 'i'), 'i')(np.ones(2)))\n")
    out, code = drive(["-m", "spmdsim", "debug", "-m", "mymod", "--lr", "3", "--devices", "2"], ["c"], cwd=tmp_path)
    assert code == 0, out
    assert "argv ['--lr', '3']" in out and "sum [2. 2.]" in out and "stop 0: psum(" in out


def test_a_script_error_shows_the_script_frames_only(tmp_path):
    (tmp_path / "bad.py").write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    proc = spmdsim_command("debug", "bad.py", cwd=tmp_path, no_jax=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f'Traceback (most recent call last):\n  File "{tmp_path / "bad.py"}", line 4, in '
                                  f'<module>'), proc.stderr  # as `python bad.py` shows it: the absolute path
    assert "runpy" not in proc.stderr and "ValueError: boom" in proc.stderr


@needs_jax
def test_run_takes_its_options_after_the_script_and_draws_svg_timelines(tmp_path):
    (tmp_path / "s.py").write_text(JAX_SCRIPT)
    proc = spmdsim_command("run", "s.py", "--out", "o", "--trace", "t.json", "--devices", "4", "--", "--trace", "x",
                           cwd=tmp_path, env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    assert "argv ['--out', 'o', '--trace', 'x']" in proc.stdout and "sum [6. 6. 6. 6.]" in proc.stdout
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["collectives"] == 1
    proc = spmdsim_command("run", "--trace", "t.svg", "s.py", cwd=tmp_path, env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    assert ET.parse(tmp_path / "t.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"


@needs_jax
def test_run_m_module(tmp_path):
    (tmp_path / "jmod.py").write_text(JAX_SCRIPT)
    proc = spmdsim_command("run", "-m", "jmod", "a", "--devices", "4", cwd=tmp_path, env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    assert "argv ['a']" in proc.stdout and "sum [6. 6. 6. 6.]" in proc.stdout


@needs_jax
def test_conformance_k_runs_a_filtered_suite_without_touching_the_tracked_report(tmp_path):
    shutil.copytree(os.path.join(ROOT, "conformance"), tmp_path / "conformance",
                    ignore=shutil.ignore_patterns("__pycache__"))
    tracked = (tmp_path / "conformance" / "REPORT.md").read_text()
    proc = spmdsim_command("conformance", "-k", "psum-bool-n2-r0", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout and "left as it was; give --report PATH" in proc.stdout  # case, 3 executor checks
    assert (tmp_path / "conformance" / "REPORT.md").read_text() == tracked


@pytest.mark.skipif(not jax_installed(), reason="needs jax")
def test_driving_a_terminal_from_a_process_running_jax_gives_jax_no_fork_to_warn_about(tmp_path):
    import warnings

    import jax.numpy as jnp

    assert float(jnp.ones(3).sum()) == 3.0                   # JAX's threads are running in this process
    (tmp_path / "prog.py").write_text("import numpy as np, spmdsim\n"
                                      "print(spmdsim.pmap(lambda v: spmdsim.lax.psum(v, 'i'), 'i')(np.ones(2)))\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, code = drive(["-m", "spmdsim", "debug", "prog.py", "--devices", "2"], ["p 1 v", "c"], cwd=tmp_path)
    assert code == 0 and "(spmdsim) p 1 v\n1.  (float64[])\n" in out and "[2. 2.]" in out, out
    assert [str(w.message) for w in caught if "fork" in str(w.message)] == []


def test_a_host_child_outlives_mpichs_failure_notice_sent_before_its_watcher_is_up():
    """The host child starts with SIGUSR1 (MPICH's "a process died") ignored: one sent while it still imports
    does not kill it (its default action would: status -10); its host's watcher reports a lost host instead.
    Started as the launch starts it: from a process without JAX (a fork of one with JAX's threads may deadlock)."""
    inner = ("import os, signal; os.kill(os.getpid(), signal.SIGUSR1); "
             "print('alive', signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)")
    code = (f"import subprocess, sys\nfrom spmdsim.tools import _launch\n"
            f"p = subprocess.run([sys.executable, '-c', {inner!r}], preexec_fn=_launch._child_setup, "
            f"capture_output=True, text=True, timeout=60)\n"
            f"print(p.returncode, p.stdout.strip(), 'jax' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "0 alive True False\n", ""), proc.stderr


@needs_jax
def test_the_launcher_of_hosts_and_the_parent_of_each_host_import_no_jax(tmp_path):
    """``spmdsim run --hosts H`` and the process mpiexec starts for each host (of run or compare) only start other
    processes and wait for them: they do it before JAX is imported (about 1.3 s of CPU per process saved)."""
    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    code = (f"import os, sys\nfrom spmdsim.tools import _launch\n"
            f"_launch.launch = lambda hosts, argv: print('launch', hosts, argv) or 7\n"
            f"_launch.run_as_host_child = lambda argv: print('child', argv) or 8\n"
            f"print(_launch.before_import('run', ['--hosts', '2', '--devices', '4', {str(script)!r}, 'a']))\n"
            f"print(_launch.before_import('run', ['--devices', '4', {str(script)!r}]))\n"
            f"os.environ['PMI_SIZE'] = '2'\n"
            f"print(_launch.before_import('compare', ['--devices', '4', {str(script)!r}]))\n"
            f"print('jax imported:', 'jax' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PMI_SIZE"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"launch 2 ['run', '--devices', '4', '--executor', 'threads', '--eager-shard-map', 'once', "
        f"{str(script)!r}, '--', 'a']", "7",
        "None",  # one process: spmdsim run itself
        f"child ['compare', '--devices', '4', {str(script)!r}]", "8",
        "jax imported: False"]


@needs_jax
def test_the_launchers_mistakes_are_one_line_errors(tmp_path):
    (tmp_path / "prog.py").write_text("print('ran')\n")
    line = one_line_error(spmdsim_command("run", "--hosts", "2", "--devices", "3", "prog.py", cwd=tmp_path),
                          "spmdsim run")
    assert line.endswith("--devices 3 cannot be split evenly over --hosts 2")
    line = one_line_error(spmdsim_command("run", "--hosts", "2", "nonexist.py", cwd=tmp_path), "spmdsim run")
    assert "no such script: 'nonexist.py'" in line


@pytest.mark.parametrize("version, used", [("mpiexec (Open MPI) 4.1.6", False), ("HYDRA build details:", True)])
def test_only_mpichs_mpiexec_launches_hosts(tmp_path, monkeypatch, version, used):
    """No mpiexec beside this Python, one on PATH: MPICH's (Hydra) is used; another MPI's (Open MPI's takes no
    ``-iface``) is not, and ``--hosts`` says which it found and what to install."""
    pytest.importorskip("mpi4py")
    from spmdsim.tools import _launch

    fake = tmp_path / "bin" / "mpiexec"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho '{version}'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(fake.parent))
    _launch.mpiexec_path.cache_clear()
    try:
        assert _launch.mpiexec_path() == (str(fake) if used else None)
        if not used:
            with pytest.raises(UsageError, match=rf"MPICH's mpiexec\).*the mpiexec on PATH, {re.escape(str(fake))}, "
                                                 r"is another MPI's"):
                _launch.launch(2, ["run", "x.py"])
    finally:
        _launch.mpiexec_path.cache_clear()
