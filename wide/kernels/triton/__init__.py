"""Triton kernels and their host functions; imported lazily by the ``triton`` backend only."""
