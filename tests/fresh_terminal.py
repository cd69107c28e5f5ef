"""Driving a program on a pseudo-terminal without forking the test process through Python's fork hooks.

``terminal.drive`` starts the child with a ``preexec_fn``, which makes ``subprocess`` fork through
``os.fork``'s at-fork handlers: once the test process has imported jax, each start prints JAX's
"RuntimeWarning: os.fork() was called ... JAX is multithreaded". Here the child is started without
``preexec_fn`` (``subprocess`` then forks and execs in C, running no Python in the child, so nothing JAX
warns about happens); the new session comes from ``start_new_session``, and the controlling terminal is taken
by a fresh interpreter that then execs the program."""
import os
import select
import subprocess
import sys
import time

from terminal import _MODES, PROMPT, ROOT

# In the fresh child (a session leader already): make the pseudo-terminal on stdin the controlling terminal, so
# that Ctrl-C typed there sends SIGINT, as in a shell; then become `python ARGV`.
_TAKE_TERMINAL = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                  "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def drive(argv, commands, timeout=120, env=None, cwd=None):
    """As ``terminal.drive``: run ``python ARGV`` on a pseudo-terminal (its controlling terminal), answering
    each prompt with the next command; returns the output (newlines normalised) and the exit status."""
    import pty

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
