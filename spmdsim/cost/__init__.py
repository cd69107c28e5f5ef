"""What would this cost on real hardware? A roofline and collective cost model on spmdsim's programs.

spmdsim runs a program on virtual devices; this package predicts how long each mapped call would take on
accelerators you may not have: per equation, FLOPs and HBM bytes against the chip's roofline; per collective,
the scaling book's formulas on the chips' interconnect (jax-ml/scaling-book, "How to Scale Your Model").

- :func:`topology` / :mod:`.hardware`: chips as data (``spmdsim/data/hardware.json``, each value with its
  public source) and a mesh laid on them: ``"tpu-v5e:2x4"``, ``"tpu-v5p:4x4x4"``, ``"h100:8"``.
- :mod:`.collectives`: all-gather, reduce-scatter, all-reduce, all-to-all and ppermute times on a topology.
- :func:`analyze` / :mod:`.model`: a map's body jaxpr as ops with FLOPs, bytes and collectives.
- :func:`predicting` (watch a run), :func:`predict` (trace without running): the tables and a Perfetto track;
  ``spmdsim run --hardware tpu-v5e:2x4 prog.py`` prints them for a script.

See docs/cost_model.md for what the model assumes and leaves out.
"""
from spmdsim.cost import collectives
from spmdsim.cost.hardware import Chip, Topology, chip, chips, load_chip, topology
from spmdsim.cost.model import MapCost, MapPrediction, analyze
from spmdsim.cost.report import Predictor, Report, predict, predicting

__all__ = ["Chip", "Topology", "chip", "chips", "load_chip", "topology", "collectives", "analyze", "MapCost",
           "MapPrediction", "Predictor", "Report", "predict", "predicting"]
