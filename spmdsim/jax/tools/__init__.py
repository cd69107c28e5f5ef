"""The JAX front end's commands: ``spmdsim run`` (``_run``), ``spmdsim compare``, equation by equation against
XLA:CPU (``_compare``), and the primitive coverage table (``_coverage``). The top layer: may import any other."""
