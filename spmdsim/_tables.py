"""Moved to :mod:`spmdsim.tools._tables` (issue 41); this name stays while docs/tutorial/7_what_would_it_cost.ipynb
imports ``print_table`` from here. Remove it once the notebook imports it from ``spmdsim.tools._tables``."""
from spmdsim.tools._tables import print_table, text_table  # noqa: F401
