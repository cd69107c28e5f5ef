"""Run under ``spmdsim run --hosts 2``: host 1 puts bytes that are not a message on the hosts' channel (a pickle
whose loading would run ``touch MARKER``, as the old pickled messages would have), then both hosts make a mapped
call. Host 0 must refuse it ("malformed message from host 1: ...") and the job end, the command never run."""
import os
import pickle
import sys

import jax
import numpy as np

from spmdsim.hosts import mpi

marker = sys.argv[1]


class Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))


host = mpi.process_host()
if host.index == 1:
    payload = np.frombuffer(pickle.dumps(Exploit()), np.uint8)
    transport = host.transport
    with transport._send_lock:
        transport.comm.Send([payload, transport.MPI.BYTE], dest=0, tag=0)
print(f"host {host.index}:", jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")(np.ones(2)), flush=True)
