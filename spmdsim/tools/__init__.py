"""What is built on top of everything else: traces of a run's collectives and their pictures (``_trace``,
``_svg``), text tables (``_tables``), running a user's script as a program (``_script``, ``_launch``: for
``spmdsim run``, ``debug`` and ``compare``), and the debugger behind :mod:`spmdsim.debug` (``_debug_stops``: a
stop, its table, evaluating in a device's frame; ``_debugger``: breakpoints and the terminal front end). The
public tools beside it (:mod:`spmdsim.show`, :mod:`spmdsim.debug`, :mod:`spmdsim.testing`, :mod:`spmdsim.cost`,
:mod:`spmdsim.cli`) and ``spmdsim.jax.tools`` belong to this layer: they may import any layer; no layer below
imports them."""
