"""Redraw what docs/ shows: ``python docs/make_figures.py`` (from the repository root) redraws the
docs pages' figures; ``--notebooks`` also executes the tutorial notebooks in docs/tutorial/ and stores their outputs.
Each figure is drawn by spmdsim itself; the notebooks need nbclient and ipykernel (the ``test`` extra)."""
import os
import runpy
import sys

import numpy as np

import spmdsim

DOCS = os.path.dirname(os.path.abspath(__file__))
TUTORIAL = os.path.join(DOCS, "tutorial")


def figures() -> None:
    x = np.arange(16.0).reshape(4, 4)
    spmdsim.show.sharding(np.arange(12).reshape(3, 4), in_axes=1, echo=False).save(f"{DOCS}/sharding_in_axes_1.svg")
    spmdsim.show.collective("all_to_all", x, split_axis=0, concat_axis=0, echo=False).save(f"{DOCS}/all_to_all.svg")
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    spmdsim.show.collective("all_gather", np.arange(16).reshape(4, 4), mesh=mesh, spec=spmdsim.P("x", "y"),
                            axis_name="x", axis=1, tiled=True, echo=False).save(f"{DOCS}/all_gather_mesh.svg")
    sys.path.insert(0, os.path.join(DOCS, "..", "examples"))
    runpy.run_path(os.path.join(DOCS, "..", "examples", "debugging_tour.py"))["main"](DOCS)  # ring_timeline.svg
    print(f"redrew sharding_in_axes_1.svg, all_to_all.svg, all_gather_mesh.svg, ring_timeline.svg and "
          f"ring_trace.json in {DOCS}")


def notebooks() -> list[str]:
    """The tutorial notebooks, in reading order."""
    return sorted(os.path.join(TUTORIAL, name) for name in os.listdir(TUTORIAL) if name.endswith(".ipynb"))


def execute(path: str, *, write: bool, env: dict | None = None, timeout: int = 120):
    """Run a notebook top to bottom in a fresh kernel (working directory: its folder); returns it with its
    outputs, and with ``write`` stores them in the file. A failing cell raises nbclient's CellExecutionError."""
    import nbclient
    import nbformat

    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(book, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    client.execute(env={**os.environ, **(env or {})})
    if write:
        nbformat.write(book, path)
    return book


if __name__ == "__main__":
    figures()
    if "--notebooks" in sys.argv[1:]:
        for path in notebooks():
            execute(path, write=True)
            print(f"executed {os.path.relpath(path, DOCS)}")
