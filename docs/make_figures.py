"""Redraw the figures in docs/ that the README shows: ``python docs/make_figures.py`` (from the repository
root). Each is drawn by spmdsim itself; nothing else is needed."""
import os
import runpy
import sys

import numpy as np

import spmdsim

DOCS = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    x = np.arange(16.0).reshape(4, 4)
    spmdsim.show.sharding(np.arange(12).reshape(3, 4), in_axes=1, echo=False).save(f"{DOCS}/sharding_in_axes_1.svg")
    spmdsim.show.collective("all_to_all", x, split_axis=0, concat_axis=0, echo=False).save(
        f"{DOCS}/all_to_all.svg")
    sys.path.insert(0, os.path.join(DOCS, "..", "examples"))
    runpy.run_path(os.path.join(DOCS, "..", "examples", "debugging_tour.py"))["main"](DOCS)  # ring_timeline.svg
    print(f"redrew sharding_in_axes_1.svg, all_to_all.svg, ring_timeline.svg and ring_trace.json in {DOCS}")


if __name__ == "__main__":
    main()
