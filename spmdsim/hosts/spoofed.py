"""Spoofed hosts: every host a thread of this process (``spmdsim.run_hosts`` outside MPI, for tests and
notebooks), each a :class:`~spmdsim.hosts.host.Host` over a :class:`~spmdsim.hosts.transport.ThreadTransport`,
entered as its thread's process group.
"""
from __future__ import annotations

import threading
from typing import Callable

from spmdsim.runtime import _process_group
from spmdsim.hosts.host import Host
from spmdsim.hosts.messages import how_it_ended
from spmdsim.hosts.transport import Fabric

__all__ = ["run_spoofed"]

STOP_SECONDS = 1.0  # after Ctrl-C, how long run_spoofed waits for the host threads (one busy in its own code
#                    runs on, a daemon, until its next mapped call, which raises)


def run_spoofed(count: int, local: int, fn: Callable, args: tuple, kwargs: dict) -> list:
    """``spmdsim.run_hosts`` in one process: ``count`` host threads, each running ``fn`` as its host."""
    fabric = Fabric(count)
    hosts = [Host(h, count, local, fabric.transport(h)) for h in range(count)]
    outcome: list = [None] * count

    def host_main(h: int) -> None:
        host = hosts[h]
        _process_group.enter(host)
        try:
            outcome[h] = ("value", host.run_program(fn, args, kwargs))
        except BaseException as e:  # noqa: BLE001 - raised by run_hosts
            outcome[h] = ("error", e)
        finally:
            host.finish(how_it_ended(outcome[h][1] if outcome[h][0] == "error" else None))
            _process_group.leave()

    threads = [threading.Thread(target=host_main, args=(h,), name=f"spmdsim host {h}", daemon=True)
               for h in range(count)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:  # Ctrl-C: every host loses the others, so that every wait ends, then stops
        for host in hosts:
            for h in range(count):
                if h != host.index:
                    host._lose(h, f"host {h} stopped by Ctrl-C")
        for t in threads:
            t.join(timeout=STOP_SECONDS)
        raise
    kind, item = outcome[0]
    if kind == "error":
        raise item
    return item
