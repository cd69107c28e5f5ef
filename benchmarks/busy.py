"""A second process busy on one core while benchmarks run (``python -m benchmarks --busy``): ``with
busy_process(): ...`` starts ``python -c "while True: pass"`` (in effect), waits until it loops, and kills it
when the block ends, on an error or Ctrl-C too. Should this process die without running its ``finally``
(SIGKILL), the loop notices within a few hundredths of a second that its parent changed and ends itself."""
import contextlib
import subprocess
import sys

LOOP = """import os
parent = os.getppid()
print("busy", flush=True)
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


@contextlib.contextmanager
def busy_process():
    proc = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()  # it loops from here on
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
