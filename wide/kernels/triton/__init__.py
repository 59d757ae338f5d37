"""The ``triton`` backend's op families, one module each: host function (path choice, configs, heuristics) and
its ``@triton.jit`` kernels: `gemm_mn` (+ `gemm_mn_kernels`), `gemm_k` (+ `gemm_k_kernels`), `attention`,
`router`, the routing plan's `partition`; `common` (no Triton import) and `tiles` are shared.

The backend imports an op module (and with it Triton) on the first call that reaches it.
"""
