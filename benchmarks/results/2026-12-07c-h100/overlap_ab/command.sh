bash benchmarks/gpu_session.sh setup >/dev/null; export PYTHONPATH=/tmp/site:$PWD BENCH_COMMIT=b344ba8
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
W="python3 -m wide.cli"
if grep -q H200 $OUT/gpu.txt; then timeout 150 $W bench --fuse-glue --coherent --prefill --sparsity 0 0.5 0.75 --decode-batch 1 4 16 --json $OUT/bench8b_decode.json > $OUT/bench8b_decode.md 2>&1; grep "^| decode" $OUT/bench8b_decode.md | cut -c1-120; fi
for ov in "" "--no-overlap-routing"; do t=${ov:+_main}
  for s in llama-8b qwen2.5-1.5b; do timeout 90 python3 benchmarks/profile_decode.py --shape $s --batch 1 --router lowrank --sparsity 0.5 --top 14 $ov > $OUT/prof_${s}$t.txt 2>&1; echo "$s $t"; grep "wall" $OUT/prof_${s}$t.txt; done
done
grep -q H200 $OUT/gpu.txt || for ov in "" "--no-overlap-routing"; do t=${ov:+_main}
  timeout 120 $W bench --fuse-glue --coherent --router lowrank --prefill --sparsity 0.5 --decode-batch 1 16 $ov --json $OUT/bench8b_lr$t.json > $OUT/bench8b_lr$t.md 2>&1; grep "^| decode" $OUT/bench8b_lr$t.md | cut -c1-120; done
