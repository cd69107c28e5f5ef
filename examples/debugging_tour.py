"""A tour of spmdsim's debugging tools on a ring all-reduce written by hand (reduce-scatter + all-gather
with ppermute), checked against lax.psum. Writes a Perfetto trace and a timeline picture into OUT_DIR (default:
the current folder), and says where:

    python examples/debugging_tour.py [OUT_DIR]
"""
import os
import sys

import numpy as np

import spmdsim
from spmdsim import lax

N = 4


def ring_allreduce(x):
    """Sum x over the ring 'i' by passing chunks to the right neighbour: 2 * (N - 1) ppermutes."""
    me = int(lax.axis_index("i"))
    right = [(k, (k + 1) % N) for k in range(N)]
    chunks = list(np.split(np.array(x), N))
    for s in range(N - 1):                       # reduce-scatter
        send = (me - s) % N
        received = lax.ppermute(chunks[send], "i", right)
        chunks[(me - s - 1) % N] = chunks[(me - s - 1) % N] + received
    for s in range(N - 1):                       # all-gather
        send = (me + 1 - s) % N
        chunks[(me - s) % N] = lax.ppermute(chunks[send], "i", right)
    if me == 0:
        print("device 0 finished the ring")
    return np.concatenate(chunks), lax.psum(x, "i")


def main(out_dir="."):
    x = np.arange(N * 8, dtype=np.float32).reshape(N, 8)
    with spmdsim.trace(values="summary") as tr:
        ring, reference = spmdsim.pmap(ring_allreduce, axis_name="i")(x)
    print("ring all-reduce equals psum:", np.array_equal(ring, reference))
    tr.summary()
    trace_file, picture = os.path.join(out_dir, "ring_trace.json"), os.path.join(out_dir, "ring_timeline.svg")
    tr.to_perfetto(trace_file)
    tr.to_svg(picture)
    print(f"wrote {os.path.abspath(trace_file)} (open it at https://ui.perfetto.dev)")
    print(f"wrote {os.path.abspath(picture)} (the timeline: open it in a browser)")
    return ring, reference, tr


if __name__ == "__main__":
    main(*sys.argv[1:])
