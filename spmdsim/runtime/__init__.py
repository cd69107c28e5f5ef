"""The runtime: virtual devices as threads and what they meet in. The process group (``_process_group``, the
seam the hosts plug into), the devices and hosts it reports (``_devices``, ``_hosts``), named axes (``_axes``),
the rendezvous where a collective's devices meet and the reports of a mismatch or deadlock (``_rendezvous``,
``_reports``), the mapped call itself (``_runtime.run_mapped``: one thread per device), per-device output
(``_output``), and the NumPy plumbing every layer above uses (``_threads``, ``_blas``, ``_fpenv``, ``_buffers``,
``_values``, ``_tree``). The bottom layer: it imports nothing of spmdsim but itself and :mod:`spmdsim.errors`."""
