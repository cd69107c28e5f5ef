"""The JAX front end's commands: ``spmdsim run`` (``_run``), ``spmdsim compare``, equation by equation against
XLA:CPU (``_compare``: the observer and the command; ``_compare_report``: the report, its tables and the hosts'
merge; ``_compare_sides``: what XLA, another reduction order or the other executor computes, and the runs of
equations XLA fuses), and the primitive coverage table (``_coverage``). The top layer: may import any other."""
