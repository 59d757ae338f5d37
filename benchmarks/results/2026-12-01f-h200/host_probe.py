import time, torch, sys
sys.path.insert(0, ".")
from wide.kernels import router_margin
from wide.kernels.backends.base import KernelBackend
from wide.kernels import get_backend
from wide.kernels.triton import router as tr
dev = "cuda"
x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
down = torch.randn(32, 4096, device=dev) / 64
up = torch.randn(112, 32, device=dev) / 6
halves = tr._halves(down, x.dtype)
h = tr._mm_fp32(x, halves)
B = get_backend("triton")
def host(name, fn, n=200):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    print(f"{name:34s} {dt:8.1f} us host/call", flush=True)
host("_halves (cached)", lambda: tr._halves(down, x.dtype))
host("_mm_fp32", lambda: tr._mm_fp32(x, halves))
host("router_tail", lambda: tr.router_tail(x, h, True, up, None, True, 1e-6, True))
host("backend.router_margin", lambda: B.router_margin(x, down, up, None))
host("ops.router_margin triton", lambda: router_margin(x, down, up, backend="triton"))
host("ops.router_margin torch", lambda: router_margin(x, down, up, backend="torch"))
host("empty launch: x.add_(0)", lambda: x.add_(0))
