import time, torch, sys
sys.path.insert(0, ".")
from wide.kernels import router_margin
dev = "cuda"
big = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
w = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
down = torch.randn(32, 4096, device=dev) / 64
up = torch.randn(112, 32, device=dev) / 6
def probe(name, fn):
    fn(); torch.cuda.synchronize()
    for _ in range(20): big @ big          # ~20 x 1.1 ms of queued GPU work
    t0 = time.perf_counter()
    for _ in range(10): fn()
    host = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    print(f"{name:40s} host {host:7.2f} ms for 10 calls behind ~20 ms of queued work", flush=True)
probe("F.linear bf16", lambda: torch.nn.functional.linear(x, w))
probe("torch.mm out_dtype fp32", lambda: torch.mm(x, w.t(), out_dtype=torch.float32))
probe("vector_norm fp32", lambda: torch.linalg.vector_norm(x, dim=-1, dtype=torch.float32))
probe("router_margin 4096 rows (triton)", lambda: router_margin(x, down, up, backend="triton"))
probe("router_margin 4096 rows (torch)", lambda: router_margin(x, down, up, backend="torch"))
