"""Running spmdsim's commands as a user does: on a pseudo-terminal (the debugger) or as a subprocess."""
import importlib.util
import os
import pty
import select
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jax_installed() -> bool:
    """Whether jax can be imported, without importing it (a folder named jax on sys.path, such as
    examples/jax, is not jax)."""
    spec = importlib.util.find_spec("jax")
    return spec is not None and spec.origin is not None
# Run `python -m spmdsim ...` with jax made unimportable (as in an environment without it).
NO_JAX = ("import sys; sys.modules['jax'] = None; from spmdsim.cli import main; sys.exit(main(sys.argv[1:]))",)


def drive(argv, commands, timeout=60, env=None, cwd=None):
    """Run ``python ARGV`` on a pseudo-terminal, answering each '(spmdsim) ' prompt with the next command;
    returns the whole output (newlines normalised) and the exit status."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, *argv], stdin=terminal, stdout=terminal, stderr=terminal,
                            env={**os.environ, "PYTHONPATH": ROOT, **(env or {})}, close_fds=True, cwd=cwd)
    os.close(terminal)
    output, pending, deadline = b"", list(commands), time.time() + timeout
    try:
        while time.time() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
                if output.endswith(b"(spmdsim) ") and pending:
                    os.write(controller, (pending.pop(0) + "\n").encode())
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise AssertionError("the debugger did not finish:\n" + output.decode(errors="replace"))
    finally:
        code = proc.wait(timeout=30)
        os.close(controller)
    return output.decode(errors="replace").replace("\r\n", "\n"), code


def spmdsim_command(*args, cwd=None, no_jax=False, timeout=120, env=None):
    """``python -m spmdsim ARGS`` (or, with ``no_jax``, the same with jax unimportable) as a subprocess."""
    argv = ["-c", NO_JAX[0], *args] if no_jax else ["-m", "spmdsim", *args]
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd or ROOT, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
