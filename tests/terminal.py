"""Running spmdsim's commands as a user does: on a pseudo-terminal (the debugger) or as a subprocess."""
import importlib.util
import os
import pty
import re
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


# A prompt the driver answers: the debugger's, and pdb's inside a device ("(Pdb device 2 [i=2]) ").
PROMPT = re.compile(rb"\((?:spmdsim|Pdb[^)\n]*)\) $")
# Terminal modes readline may switch (bracketed paste, meta key): not part of what is shown.
_MODES = re.compile(rb"\x1b\[\?(?:2004|1034)[hl]")


# In the child, started as a session leader without a ``preexec_fn`` (one would make ``subprocess`` fork through
# ``os.fork``'s at-fork handlers, and a test process that imported jax would print JAX's "os.fork() was called"
# warning): make the pseudo-terminal on stdin the controlling terminal, so that Ctrl-C typed there sends SIGINT,
# as in a shell; then become `python ARGV`.
_TAKE_TERMINAL = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                  "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def drive(argv, commands, timeout=120, env=None, cwd=None):
    """Run ``python ARGV`` on a pseudo-terminal (its controlling terminal, as a shell gives), answering each
    prompt ('(spmdsim) ' or pdb's) with the next command, typed with Enter; a command ending in a control
    character (Ctrl-C is "\x03", "\x1b[A\n" is Up then Enter) is typed as is. Returns the whole output (newlines
    normalised, readline's terminal-mode switches removed) and the exit status."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", _TAKE_TERMINAL, *argv], stdin=terminal, stdout=terminal,
                            stderr=terminal, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})}, close_fds=True,
                            cwd=cwd, start_new_session=True)
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
                output = _MODES.sub(b"", output + chunk)
                if pending and PROMPT.search(output):
                    command = pending.pop(0)
                    typed = command if command[-1:] and command[-1] < " " else command + "\n"
                    os.write(controller, typed.encode())
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
