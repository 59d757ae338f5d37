"""The compile job of `test_sm90_compile.py`, run by it as one subprocess without ``TRITON_INTERPRET`` (see that
module's docstring): records each launch of the kernels at the default configs and compiles it for sm_90.
Prints ``RESULT {json}``. Not a test module (pytest collects ``test_*.py`` only)."""
import concurrent.futures, dataclasses, inspect, json, os, re, traceback
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, mangle_type
from wide.kernels.triton import attention, coherent, gemm_k, gemm_mn, partition, router
from wide.kernels.triton import decode_qkv as qkv_mod
from wide.kernels.triton import experts as experts_mod
from wide.kernels.experts import ExpertLayout
from wide.kernels.options import KernelOptions, use_kernel_options
from wide.kernels.triton.common import GemmConfig, for_element_size

MAX_SHARED = 232448  # bytes of shared memory one block may use on sm_90 (227 KiB); more fails at launch
MODULES = {"router": router, "coherent": coherent, "gemm_mn": gemm_mn, "gemm_k": gemm_k, "attention": attention,
           "partition": partition, "decode_qkv": qkv_mod, "experts": experts_mod}


def launched(mod):
    # the module's @triton.jit functions that it launches (``name[grid](...)``); helpers are inlined
    jit = {n for n, o in vars(mod).items() if isinstance(o, JITFunction)}
    return sorted(jit & set(re.findall(r"\b(\w+)\[", inspect.getsource(mod))))


KERNELS = {f"{m}.{n}": getattr(mod, n) for m, mod in MODULES.items() for n in launched(mod)}
jobs, seen, errors = [], set(), []


def compile_sm90(fn, signature, constexprs, num_warps, num_stages, divisible=()):
    # divisible: indices of the parameters Triton's launcher marks 16-divisible (pointers, ints % 16 == 0)
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                    attrs={(i,): [["tt.divisibility", 16]] for i in divisible})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def job(kernel, case, signature, constexprs, num_warps=4, num_stages=3, divisible=None):
    # divisible None: the launch as passed; a list: as Triton's launcher specialises it (`specialized`)
    key = json.dumps([kernel, signature, constexprs, num_warps, num_stages, divisible], sort_keys=True)
    if key not in seen:  # the same launch from several cases compiles once
        seen.add(key)
        jobs.append(dict(kernel=kernel, case=case if divisible is None else case + " [specialized]",
                         signature=signature, constexprs=constexprs, num_warps=num_warps, num_stages=num_stages,
                         divisible=divisible))


def specialized(fn, bound, sig, consts):
    """The launch as Triton's launcher compiles it on the GPU: ints equal to 1 become constexprs, and tensors (fresh
    allocations: 16-byte aligned) and ints divisible by 16 are marked divisible by 16. That is the variant a real
    launch takes: it vectorises loads and pipelines them through shared memory, so it can need more shared memory
    than the launch as passed (2026-12-08: a 128-wide transposed SwiGLU tile compiled as passed, but specialised it
    needed 272 KiB)."""
    sig, consts, divisible = dict(sig), dict(consts), []
    for i, p in enumerate(fn.params):
        v = bound[p.name]
        if p.is_constexpr:
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v == 1:
            sig[p.name], consts[p.name] = "constexpr", 1
        elif isinstance(v, torch.Tensor) or (isinstance(v, int) and not isinstance(v, bool) and v % 16 == 0):
            divisible.append(i)
    return sig, consts, divisible


def run(j):
    row = {k: j[k] for k in ("kernel", "case", "constexprs", "num_warps", "num_stages")}
    try:
        k = compile_sm90(KERNELS[j["kernel"]], j["signature"], j["constexprs"], j["num_warps"], j["num_stages"],
                         j["divisible"] or ())
        row["shared"] = k.metadata.shared
        if "cubin" not in k.asm:
            row["error"] = "no cubin"
        elif k.metadata.shared > MAX_SHARED:
            row["error"] = f"needs {k.metadata.shared} bytes of shared memory, sm_90 has {MAX_SHARED}"
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[-3000:]
    return row


class Recorder:
    # stands in for a kernel: ``kernel[grid](*args, **kwargs)`` records the launch instead of running it
    def __init__(self, kernel):
        self.kernel, self.fn = kernel, KERNELS[kernel]

    def __getitem__(self, grid):
        def launch(*args, num_warps=4, num_stages=3, **kwargs):
            bound = self.fn.signature.bind(*args, **kwargs).arguments
            sig = {p.name: "constexpr" if p.is_constexpr else mangle_type(bound[p.name]) for p in self.fn.params}
            consts = {p.name: bound[p.name] for p in self.fn.params if p.is_constexpr}
            job(self.kernel, current, sig, consts, num_warps, num_stages)
            ssig, sconsts, divisible = specialized(self.fn, bound, sig, consts)
            job(self.kernel, current, ssig, sconsts, num_warps, num_stages, divisible)
        return launch


# ---- routing kernels: fixed signatures -------------------------------------------------------------
for xdtype, wdtype in (("bf16", "fp32"), ("fp16", "bf16")):
    # (coherent: batch-coherent decode's selection in the last row's program, `coherent_route`)
    # (norm: the layer's RMSNorm written by the last program too, `rms_norm_route`)
    # (prefetch: `KernelOptions.router_prefetch`, the second stage loaded before the atomic: 256 groups of rank 32)
    for has_up, decide, split, coherent, norm, prefetch in (
            (True, True, 32, None, False, False), (True, False, 1, None, False, False),
            (False, True, 64, None, False, False), (True, False, 32, (True, True, 128, 128), False, False),
            (True, False, 64, (False, False, 512, 16), False, False), (True, True, 32, None, True, False),
            (False, True, 1, None, True, False), (True, True, 32, None, False, True),
            (True, False, 32, (True, True, 256, 256), False, True), (True, True, 32, None, True, True),
            (False, True, 64, None, False, True)):
        dst = "*u8" if decide else "*fp32"
        sig = {"x_ptr": f"*{xdtype}", "down_ptr": f"*{wdtype}", "up_ptr": f"*{wdtype}", "bias_ptr": f"*{wdtype}",
               "out_ptr": "*u8" if decide else "*fp32", "part_ptr": "*fp32", "cnt_ptr": "*i32", "D": "i32",
               "R": "i32", "G": "i32", "CHUNK": "i32", "sxm": "i32", "sdr": "i32", "sug": "i32", "som": "i32",
               "eps": "fp32", "ema_ptr": "*fp32", "sel_ptr": "*u8", "step_ptr": "*i64", "order_ptr": "*i32",
               "n_ptr": "*i32", "M": "i32", "weight": "fp32", "keep": "i32", "refresh_every": "i32",
               "scale64": "i32", "gamma_ptr": f"*{xdtype}" if norm else dst, "y_ptr": f"*{xdtype}" if norm else dst,
               "sym": "i32", "norm_eps": "fp32", "NORMALIZE": "constexpr", "HAS_UP": "constexpr",
               "HAS_BIAS": "constexpr", "DECIDE": "constexpr", "SPLIT": "constexpr", "BLOCK_D": "constexpr",
               "BLOCK_R": "constexpr", "BLOCK_G": "constexpr", "COHERENT": "constexpr", "ADAPTIVE": "constexpr", "LIST": "constexpr",
               "BLOCK_GC": "constexpr", "BLOCK_J": "constexpr", "BLOCK_B": "constexpr", "WRITE_NORM": "constexpr",
               "PREFETCH": "constexpr"}
        adaptive, listed, bgc, bj = coherent or (False, False, 16, 16)
        consts = {"NORMALIZE": True, "HAS_UP": has_up, "HAS_BIAS": True, "DECIDE": decide, "SPLIT": split,
                  "BLOCK_D": 128, "BLOCK_R": 32, "BLOCK_G": 256 if prefetch else 128, "COHERENT": coherent is not None,
                  "ADAPTIVE": adaptive, "LIST": listed, "BLOCK_GC": bgc, "BLOCK_J": bj,
                  "BLOCK_B": 16 if bgc <= 128 else 8, "WRITE_NORM": norm, "PREFETCH": prefetch}
        job("router._router_margin_kernel",
            f"x {xdtype} w {wdtype} up={has_up} decide={decide} split={split} coherent={coherent} norm={norm} "
            f"prefetch={prefetch}", sig, consts)
# a prefill router's tail (`router_tail`, after the cuBLAS GEMM): low-rank with the hi / lo halves of fp32 weights
# (rank 32, BLOCK_M 8) and rank 128 (BLOCK_M 4); linear routers (G = R outputs, up to 1024)
for xdtype, has_up, split, decide, bm, br, bg in (("bf16", True, True, True, 8, 32, 16),
                                                  ("fp16", True, False, False, 4, 128, 16),
                                                  ("bf16", False, True, True, 4, 1024, 16),
                                                  ("fp32", False, False, False, 8, 128, 16)):
    sig = {"x_ptr": f"*{xdtype}", "h_ptr": "*fp32", "up_ptr": "*fp32", "bias_ptr": "*fp32",
           "out_ptr": "*u8" if decide else "*fp32", "M": "i32", "D": "i32", "R": "i32", "G": "i32", "sxm": "i32",
           "shm": "i32", "sug": "i32", "som": "i32", "eps": "fp32", "NORMALIZE": "constexpr", "SPLIT": "constexpr",
           "HAS_UP": "constexpr", "HAS_BIAS": "constexpr", "DECIDE": "constexpr", "BLOCK_M": "constexpr",
           "BLOCK_D": "constexpr", "BLOCK_R": "constexpr", "BLOCK_G": "constexpr"}
    consts = {"NORMALIZE": True, "SPLIT": split, "HAS_UP": has_up, "HAS_BIAS": True, "DECIDE": decide, "BLOCK_M": bm,
              "BLOCK_D": 4096 // bm, "BLOCK_R": br, "BLOCK_G": bg}
    job("router._router_tail_kernel", f"tail x {xdtype} up={has_up} split={split} decide={decide} R<={br}", sig,
        consts)
for mdtype in ("bf16", "fp32"):
    sig = {"m_ptr": f"*{mdtype}", "ema_ptr": "*fp32", "sel_ptr": "*u8", "step_ptr": "*i64", "order_ptr": "*i32",
           "n_ptr": "*i32", "B": "i32", "G": "i32", "smb": "i32", "weight": "fp32", "keep": "i32",
           "refresh_every": "i32", "scale64": "i32", "ADAPTIVE": "constexpr", "LIST": "constexpr",
           "BLOCK_G": "constexpr", "BLOCK_J": "constexpr", "BLOCK_B": "constexpr"}
    for adaptive in (False, True):  # 448 groups (BLOCK_G 512, 8 rows a tile, j-blocks) and 112 (128, 16 rows,
        for bg, bj, bb in ((512, 16, 8), (128, 128, 16)):  # one block), with and without the group list
            job("coherent._coherent_kernel", f"margin {mdtype} adaptive keep={adaptive} G<={bg} list={adaptive}",
                sig, {"ADAPTIVE": adaptive, "LIST": adaptive, "BLOCK_G": bg, "BLOCK_J": bj, "BLOCK_B": bb})

# ---- gemm / attention / plan kernels: what their launchers launch ----------------------------------
for name in KERNELS:
    mod, attr = name.split(".")
    if mod not in ("router", "coherent"):  # the routing kernels: fixed signatures above
        setattr(MODULES[mod], attr, Recorder(name))
attention._sm_count = lambda device: 132  # H200: decode_splits sizes the key split from the SM count
experts_mod.programs = lambda device, per_sm: 132 * per_sm  # the experts' persistent grids: the H200's SMs


DT = torch.bfloat16  # activations and weights; the fp32 cases below switch it


def t(*shape, dtype=None):
    return torch.empty(shape, device="meta", dtype=dtype or DT)


def case(module, label, fn, *args, **kwargs):
    global current
    current = f"{module}: {label}"
    try:
        fn(*args, **kwargs)
    except Exception:  # a host function that cannot launch at all
        errors.append({"module": module, "case": current, "error": traceback.format_exc()[-3000:]})


def mn(M, N, K, ng, swiglu=False, act=None, bias=False, dense=False, cfg=None):
    # gemm_mn.gemm_mn: dense path (cuBLAS + masking epilogue) when chosen, else the default config's kernel
    # (or the one given)
    group, act_id = N // ng, gemm_mn.ACTIVATIONS[act]
    x, w, w2, b, out = t(M, K), t(N, K), t(N, K) if swiglu else None, t(N) if bias else None, t(M, N)
    mask = t(M, ng, dtype=torch.bool)
    if dense:
        assert M >= gemm_mn.DENSE_MIN_M
        return gemm_mn.gemm_mn_dense(x, w, w2, b, out, mask.view(torch.uint8), group, act_id, swiglu, False)
    kernel, cfg = cfg or gemm_mn.default_mn_config(M, N, K, group, swiglu)
    cfg = for_element_size(cfg, x.element_size())
    if kernel == "direct":
        return gemm_mn.gemm_mn_direct(x, w, w2, b, out, mask.view(torch.uint8), group, act_id, swiglu, cfg)
    perm, counts = partition.partition(mask.view(1, M, ng))  # RoutingPlan.token_order(flat=True)
    gemm_mn.gemm_mn_perm(x, w, w2, b, out, perm[0], counts[0], group, act_id, swiglu, cfg)


def gk(M, N, K, ng, bias=False, x_masked=False, cfg=None, residual=False, route=False, colmajor=False):
    # gemm_k.gemm_k: the dense path for the "premask" variant, else the plan's group list for "list" (or none);
    # colmajor: the weight stored column-major (wide.set_weight_layout) with its default config
    group = K // ng
    cfg = cfg or for_element_size(gemm_k.default_k_config(M, N, K, group, colmajor=colmajor), DT.itemsize)
    mask = t(M, ng, dtype=torch.bool)
    if cfg.variant == "premask":
        return gemm_k.gemm_k_dense(t(M, K), t(N, K), t(N) if bias else None, t(M, N), mask.view(torch.uint8), group,
                                   x_masked=x_masked)
    glist = nlist = None
    if cfg.variant == "list":
        glist, nlist = partition.group_list(mask)  # RoutingPlan.group_list()
    rt = None
    if route:  # gemm_k_route's epilogue (one row): a low-rank router of rank 32 over 16 groups, the next norm
        f32 = torch.float32
        rt = (t(32, N, dtype=f32), t(16, 32, dtype=f32), t(16, dtype=f32), True, 1e-6, t(N), 1e-5, t(N),
              t(16, dtype=torch.bool))
    gemm_k.gemm_k_direct(t(M, K), t(K, N).t() if colmajor else t(N, K), t(N) if bias else None, t(M, N),
                         mask.view(torch.uint8), glist, nlist, group, cfg, x_masked=x_masked, residual=t(M, N) if residual or route else None, route=rt)


def prefill(B, T, HQ, HK, D, gsize, causal=True, lengths=False, pack=False):
    q, k, v = t(B, T, HQ, D), t(B, T, HK, D), t(B, T, HK, D)
    perm, counts = partition.partition(t(B, T, HQ // gsize, dtype=torch.bool))  # token_order(flat=False)
    lens = t(B, dtype=torch.int32) if lengths else None
    cfg = attention.default_prefill_config(T, D, DT.itemsize, KernelOptions(attn_pack=pack))
    attention.attention_prefill_routed(q, k, v, torch.empty_like(q), perm, counts, lens, gsize, causal,
                                       attention.default_scale(D), cfg)


def decode(B, S, HQ, HK, D, gsize, lengths=False, density=None, fold=None):
    q, k, v = t(B, 1, HQ, D), t(B, S, HK, D), t(B, S, HK, D)
    mask = t(B, HQ // gsize, dtype=torch.bool).view(torch.uint8)
    lens = t(B, dtype=torch.int32) if lengths else None
    cfg = attention.default_decode_config(B, HK, S, D, "cuda", density)
    if fold is not None:
        cfg = dataclasses.replace(cfg, fold=fold)
    attention.attention_decode_splits(q, k, v, torch.empty_like(q), mask, lens, gsize, attention.default_scale(D),
                                      cfg)


case("partition", "partition T=16 (BLOCK 256)", partition.partition, t(1, 16, 224, dtype=torch.bool))
case("partition", "partition T=4096 (BLOCK 1024)", partition.partition, t(2, 4096, 8, dtype=torch.bool))
case("partition", "group list M=1 G=224", partition.group_list, t(1, 224, dtype=torch.bool))
case("partition", "group list M=40 G=8", partition.group_list, t(40, 8, dtype=torch.bool))

# Llama-3-8B layers: hidden 4096; FFN 14336 in 224 groups of 64 (swiglu + gemm_k on x already masked);
# 32 query heads, 8 KV heads of 128, routed in groups of 4 heads = 512 channels of q_proj (gemm_mn) and
# o_proj (gemm_k)
H, I, HQ, HK, D = 4096, 14336, 32, 8, 128
for M in (1, 16, 128, 256, 4096):  # direct GEMV, direct x2, perm x2
    case("gemm_mn", f"swiglu M={M}", mn, M, I, H, I // 64, swiglu=True)
case("gemm_mn", "swiglu M=4096 dense", mn, 4096, I, H, I // 64, swiglu=True, dense=True)
# q_proj (no activation), and the fused activations / bias / ragged K (EVEN_K off) of gemm_mn
for M, K, act, bias in ((1, H, None, True), (1, 4160, "gelu", False), (16, H, "silu", False),
                        (32, 4160, "gelu", True), (64, H, "relu", False), (256, 4128, "silu", True),
                        (512, H, "gelu", False), (4096, H, "relu", True), (4096, H, None, False)):
    case("gemm_mn", f"gemm_mn M={M} K={K} act={act} bias={bias}", mn, M, H, K, HQ // 4, act=act, bias=bias)
for act in (None, "silu", "gelu", "relu"):
    case("gemm_mn", f"gemm_mn M=4096 act={act} dense", mn, 4096, H, H, HQ // 4, act=act, bias=True, dense=True)
# the persistent kernel (from M = 1024, groups of >= 128: gate/up in groups of 128, q_proj in groups of 512) and the
# one-program-per-tile kernel it replaced there (KernelOptions(persistent_mn=False))
for M in (1024, 4096):
    case("gemm_mn", f"swiglu groups of 128 M={M}", mn, M, I, H, I // 128, swiglu=True)
case("gemm_mn", "gemm_mn M=1024 K=4128 act=silu", mn, 1024, H, 4128, HQ // 4, act="silu")
case("gemm_mn", "gemm_mn M=2048 act=gelu bias", mn, 2048, H, H, HQ // 4, act="gelu", bias=True)
case("gemm_mn", "swiglu groups of 128 M=4096 one program per tile", mn, 4096, I, H, I // 128, swiglu=True,
     cfg=("perm", GemmConfig(128, 128, 64, 8, 3)))
case("gemm_mn", "gemm_mn M=4096 act=relu bias one program per tile", mn, 4096, H, H, HQ // 4, act="relu", bias=True,
     cfg=("perm", GemmConfig(256, 128, 64, 8, 3)))
# split-K direct tiles (the M=16 q_proj default splits K in two; any config may)
case("gemm_mn", "gemm_mn M=16 split 2 bias", mn, 16, H, H, HQ // 4, bias=True,
     cfg=("direct", GemmConfig(16, 32, 256, 4, 4, split_k=2)))
case("gemm_mn", "swiglu M=16 split 2", mn, 16, I, H, I // 128, swiglu=True,
     cfg=("direct", GemmConfig(16, 128, 128, 4, 4, split_k=2)))
case("gemm_mn", "gemm_mn GEMV split 2 ragged K", mn, 1, H, 4160, HQ // 4, act="gelu",
     cfg=("direct", GemmConfig(1, 4, 512, 4, 4, split_k=2)))
for M in (1, 16, 128, 4096):  # GEMV (affine / group list) + split-K reduce, 16/64-row tiles, premask + cuBLAS
    case("gemm_k", f"gemm_k down_proj M={M}", gk, M, H, I, I // 64, x_masked=True)
    case("gemm_k", f"gemm_k o_proj M={M}{' bias' if M == 16 else ''}", gk, M, H, H, HQ // 4, bias=M == 16)
case("gemm_k", "gemm_k M=64 split_k=1 bias", gk, 64, H, H, HQ // 4, bias=True,
     cfg=GemmConfig(64, 128, 64, split_k=1))
case("gemm_k", "gemm_k M=16 K chunks across groups", gk, 16, H, I, I // 64, cfg=GemmConfig(16, 64, 128, split_k=4))
for M in (1, 16):  # decode at 50%: each tile's group list built in the kernel (default), or the plan's list
    case("gemm_k", f"gemm_k down_proj groups of 128 M={M}", gk, M, H, I, I // 128, x_masked=True)
    case("gemm_k", f"gemm_k plan list down_proj M={M}", gk, M, H, I, I // 128, x_masked=True,
         cfg=GemmConfig(M, 32, 128, 8 if M == 1 else 4, 4, split_k=4, variant="list"))
case("gemm_k", "gemm_k tile list down_proj M=16", gk, 16, H, I, I // 128, x_masked=True,
     cfg=GemmConfig(16, 32, 128, 4, 4, split_k=8, variant="local"))
# the transposed skinny tiles (swap: weights on the MMA's M side, wgmma at block_n >= 64)
case("gemm_mn", "gemm_mn M=16 swap split 2", mn, 16, H, H, HQ // 4, bias=True,
     cfg=("direct", GemmConfig(16, 64, 128, 4, 4, split_k=2, swap=True)))
case("gemm_mn", "swiglu M=16 swap", mn, 16, I, H, I // 128, swiglu=True,  # (the default's 64-wide tile: 128
     cfg=("direct", GemmConfig(16, 64, 128, 4, 4, swap=True)))             # needs 272 KiB of shared, specialised)
case("gemm_mn", "gemm_mn M=16 swap ragged K", mn, 16, H, 4160, HQ // 4, act="gelu",
     cfg=("direct", GemmConfig(16, 64, 128, 4, 4, swap=True)))
case("gemm_k", "gemm_k plan list down_proj M=16 swap", gk, 16, H, I, I // 128, x_masked=True,
     cfg=GemmConfig(16, 64, 128, 4, 4, split_k=8, variant="list", swap=True))
case("gemm_k", "gemm_k affine o_proj M=16 swap bias", gk, 16, H, H, HQ // 4, bias=True,
     cfg=GemmConfig(16, 128, 128, 4, 4, split_k=1, swap=True))
# a decode step's residual add in the epilogue (decode_residual), and with the next norm and router (decode_route)
case("gemm_k", "gemm_k o_proj M=16 residual", gk, 16, H, H, HQ // 4, residual=True)
case("gemm_k", "gemm_k down_proj M=1 residual + route", gk, 1, H, I, I // 128, x_masked=True, route=True)
case("gemm_k", "gemm_k o_proj M=1 residual + route, no split", gk, 1, H, H, HQ // 4, route=True,
     cfg=GemmConfig(1, 32, 128, 8, 4, split_k=1))
with use_kernel_options(route_warm=True):  # the tail's operands warmed early (KernelOptions.route_warm)
    case("gemm_k", "gemm_k down_proj M=1 residual + route, warm tail", gk, 1, H, I, I // 128, x_masked=True,
         route=True)
    case("gemm_k", "gemm_k o_proj M=1 residual + route, warm tail, no split", gk, 1, H, H, HQ // 4, route=True,
         cfg=GemmConfig(1, 32, 128, 8, 4, split_k=1))
for M in (1, 16):  # column-major weights (gemm_k.COLMAJOR_DECODE), listed and affine; one row with the route epilogue
    case("gemm_k", f"gemm_k column-major down_proj M={M}", gk, M, H, I, I // 128, x_masked=True, colmajor=True)
    case("gemm_k", f"gemm_k column-major o_proj M={M}", gk, M, H, H, HQ // 4, residual=True, colmajor=True)
    case("gemm_k", f"gemm_k column-major affine down_proj M={M}", gk, M, H, I, I // 128, colmajor=True,
         cfg=gemm_k.affine_k_config(M, H, I, 128, colmajor=True))
case("gemm_k", "gemm_k column-major down_proj M=1 residual + route", gk, 1, H, I, I // 128, x_masked=True, route=True,
     colmajor=True)
for M in (1, 16):  # near-dense decode: no group list (gemm_k.affine_k_config)
    case("gemm_k", f"gemm_k affine down_proj M={M}", gk, M, H, I, I // 128, x_masked=True,
         cfg=gemm_k.affine_k_config(M, H, I, 128))
    case("gemm_k", f"gemm_k affine o_proj M={M}", gk, M, H, H, HQ // 4, cfg=gemm_k.affine_k_config(M, H, H, 512))


def gk_sorted(M, N, K, ng, bias=False, x_masked=False, split=1):
    # gemm_k.gemm_k with the sorted variant: RoutingPlan.tile_order(block_m) gives the three lists
    group = K // ng
    cfg = for_element_size(gemm_k.sorted_k_config(M, N, K, group), DT.itemsize)
    if split > 1:
        cfg = GemmConfig(cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, split_k=split,
                              variant="sorted")
    tiles = -(-M // cfg.block_m)
    mask = t(M, ng, dtype=torch.bool)
    gemm_k.gemm_k_sorted(t(M, K), t(N, K), t(N) if bias else None, t(M, N), mask.view(torch.uint8),
                       t(M, dtype=torch.int32), t(tiles, ng, dtype=torch.int32), t(tiles, dtype=torch.int32), group,
                       cfg, x_masked=x_masked)


for M in (512, 4096):  # structured masks at prefill: pattern-sorted tiles with their own group lists
    case("gemm_k", f"gemm_k sorted down_proj M={M}", gk_sorted, M, H, I, I // 128, x_masked=True)
    case("gemm_k", f"gemm_k sorted o_proj M={M}", gk_sorted, M, H, H, HQ // 4)
case("gemm_k", "gemm_k sorted o_proj M=4096 bias split 2", gk_sorted, 4096, H, H, HQ // 4, bias=True, split=2)
# fp32 models (the GPU tests' tiny ones; users routing an fp32 model): the backend halves the default
# block_k for 4-byte operands (common.for_element_size); without it a 16 x 128 x 128 swiglu tile needed 408 KiB
DT = torch.float32
for M in (16, 36, 128, 4096):
    case("gemm_mn", f"fp32 swiglu M={M}", mn, M, I, H, I // 64, swiglu=True)
    case("gemm_mn", f"fp32 gemm_mn M={M}", mn, M, H, H, HQ // 4)
for M in (16, 128):
    case("gemm_k", f"fp32 gemm_k down_proj M={M}", gk, M, H, I, I // 64, x_masked=True)
case("gemm_k", "fp32 gemm_k sorted o_proj M=4096", gk_sorted, 4096, H, H, HQ // 4)
case("attention", "fp32 prefill T=4096", prefill, 1, 4096, HQ, HK, D, 4)
case("attention", "fp32 prefill T=16384", prefill, 1, 16384, HQ, HK, D, 4)
case("attention", "fp32 prefill T=512 D=32", prefill, 2, 512, 8, 2, 32, 4)
case("attention", "fp32 decode B=16 S=4096", decode, 16, 4096, HQ, HK, D, 4)
DT = torch.bfloat16
case("attention", "prefill T=16", prefill, 1, 16, HQ, HK, D, 4)
case("attention", "prefill T=16384 lengths", prefill, 1, 16384, HQ, HK, D, 4, lengths=True)
case("attention", "prefill T=2048 D=64 one head per group non-causal lengths", prefill, 2, 2048, HQ, HK, 64, 1,
     causal=False, lengths=True)
# Qwen2.5-1.5B attention: 12 query heads over 2 KV heads, 6 heads per unit padded to 8 rows per token
case("attention", "prefill T=4096 Qwen2.5-1.5B heads", prefill, 1, 4096, 12, 2, D, 6)
case("attention", "prefill T=4096 SmolLM2-135M heads", prefill, 1, 4096, 9, 3, 64, 3)
case("attention", "prefill T=16384 SmolLM2-135M heads", prefill, 1, 16384, 9, 3, 64, 3)
case("attention", "prefill T=4096 Qwen2.5-1.5B heads packed", prefill, 1, 4096, 12, 2, D, 6, pack=True)
case("attention", "prefill T=4096 SmolLM2-135M heads packed", prefill, 1, 4096, 9, 3, 64, 3, pack=True)
case("attention", "prefill T=16384 SmolLM2-135M heads packed", prefill, 1, 16384, 9, 3, 64, 3, pack=True)
case("attention", "decode B=16 S=4096 Qwen2.5-1.5B heads", decode, 16, 4096, 12, 2, D, 6)
case("attention", "decode B=1 S=32768", decode, 1, 32768, HQ, HK, D, 4)
case("attention", "decode B=16 S=4096 splits folded", decode, 16, 4096, HQ, HK, D, 4, fold=True)
case("attention", "decode B=16 S=4096 splits folded lengths", decode, 16, 4096, HQ, HK, D, 4, lengths=True, fold=True)
case("attention", "decode B=16 S=4096 two launches", decode, 16, 4096, HQ, HK, D, 4, fold=False)
case("attention", "decode B=4 S=4096 lengths", decode, 4, 4096, HQ, HK, D, 4, lengths=True)
case("attention", "decode B=16 S=32768 lengths", decode, 16, 32768, HQ, HK, D, 4, lengths=True)
case("attention", "decode B=16 S=4096 lengths all heads", decode, 16, 4096, HQ, HK, D, 4, lengths=True, density=1.0)



def qkv(B, K, HQ, HK, D, G, bias=False, part="all", eager=False):
    # decode_qkv.decode_qkv's launch (G: head groups of the mask, 0: no mask); caches of a 4k context
    x, ws = t(B, 1, K), (t(HQ * D, K), t(HK * D, K), t(HK * D, K))
    bs = (t(HQ * D), t(HK * D), t(HK * D)) if bias else (None, None, None)
    mask = t(B, 1, G, dtype=torch.bool) if G else None
    cache = t(B, HK, 4160, D)
    qkv_mod.decode_qkv(x, *ws, mask, *bs, t(1, 1, D), t(1, 1, D), cache, t(B, HK, 4160, D),
                       t(1, dtype=torch.int64), eager_rope=eager, part=part)


case("decode_qkv", "8B b1 every q head", qkv, 1, 4096, 32, 8, 128, 0)
case("decode_qkv", "8B b1 half the heads", qkv, 1, 4096, 32, 8, 128, 8)
case("decode_qkv", "8B b1 k / v part", qkv, 1, 4096, 32, 8, 128, 8, part="kv")
case("decode_qkv", "8B b1 q part", qkv, 1, 4096, 32, 8, 128, 8, part="q")
case("decode_qkv", "Qwen2.5-1.5B b16 bias eager RoPE", qkv, 16, 1536, 12, 2, 128, 2, bias=True, eager=True)
case("decode_qkv", "Qwen2.5-1.5B b5 q part", qkv, 5, 1536, 12, 2, 128, 2, bias=True, part="q")
case("decode_qkv", "SmolLM2 b1 head dim 64", qkv, 1, 576, 9, 3, 64, 3)


def experts(M, N, G, width, dtype=None):
    # the FFN-as-experts helpers (wide.kernels.triton.experts): the layout of an [M, G] mask, the rows / column
    # blocks gathered, SwiGLU over the grouped rows, the fixed-order combine of the partial rows
    dt = dtype or DT
    ends, rows, slot = experts_mod.build_layout(t(M, G, dtype=torch.bool))
    lay = ExpertLayout(ends=ends, rows=rows, slot=slot, capacity=M * G, counts=None)
    experts_mod.gather_rows(t(M, N, dtype=dt), lay)
    experts_mod.gather_cols(t(M, G * width, dtype=dt), lay, width)
    experts_mod.swiglu_rows(t(M * G, width, dtype=dt), t(M * G, width, dtype=dt), lay)
    experts_mod.combine(t(M * G, N, dtype=dt), slot, t(M, N, dtype=dt))


case("experts", "8B FFN groups of 1024, M=4096", experts, 4096, 4096, 14, 1024)
case("experts", "8B o_proj groups of 512, M=16384", experts, 16384, 4096, 8, 512)
case("experts", "fp32 M=2048", experts, 2048, 1536, 7, 1280, torch.float32)
DT = torch.float32
case("decode_qkv", "fp32 8B b1", qkv, 1, 4096, 32, 8, 128, 8)
case("decode_qkv", "fp32 b16", qkv, 16, 1536, 12, 2, 128, 0)
DT = torch.bfloat16

# compiling releases the GIL (MLIR passes, ptxas): threads share the cores, as Triton's AsyncCompileMode does
with concurrent.futures.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
    rows = list(pool.map(run, jobs))
print("RESULT " + json.dumps({"rows": rows, "errors": errors, "kernels": sorted(KERNELS)}))
