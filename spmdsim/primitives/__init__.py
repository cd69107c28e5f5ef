"""The collective primitives in NumPy: ``psum``, ``all_gather``, ``ppermute``... as a rendezvous of the device
threads or along the stacked device axis of a vectorized batch (``_primitives``), the order a reduction adds in
(``_reduction``), and how a sharded array's blocks lie on a mesh (``_sharding``). Imports the runtime only (and
:mod:`spmdsim.errors`); both front ends and the hosts build on it."""
