"""What is built on top of everything else: traces of a run's collectives and their pictures (``_trace``,
``_svg``), text tables (``_tables``), and running a user's script as a program (``_script``, ``_launch``: for
``spmdsim run``, ``debug`` and ``compare``). The public tools beside it (:mod:`spmdsim.show`, :mod:`spmdsim.debug`,
:mod:`spmdsim.testing`, :mod:`spmdsim.cost`, :mod:`spmdsim.cli`) and ``spmdsim.jax.tools`` belong to this layer:
they may import any layer; no layer below imports them."""
