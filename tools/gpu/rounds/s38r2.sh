# Session 38, round 2: kAuto's per-token attention launch over the range of blocks the flash
# kernel leaves (attention_per_token_range), not every token of a mixed pass (s38r1: serving's
# prefill passes at 36.8 us a token, bench's pp512 x8 at 27.8). The attention tests; serving 120b
# at 32 and 64 streams, HEAD's binary (gptoss_base) and this one, twice each; then a traced
# serve at 64 streams and a traced pp512 x8, their eager kernels side by side.
# Pack: EXTRA_BINS="/tmp/bb/gptoss_base build/libgptoss_kernel_trace.so" PACK_TESTS=test_cuda_kernels tools/gpu/pack.sh
#   (gptoss_base: HEAD 29d821b's gptoss, built in a worktree)
source tools/gpu/rounds/prelude.sh
ts tests
t attn 300 $K --gtest_filter='*Attention*'
for i in 1 2; do
  g=$bin/gptoss_base srv $((18100 + 2 * i)) 120b -- 32 64
  srv $((18101 + 2 * i)) 120b -- 32 64
done
ts trace
tr=$bin/libgptoss_kernel_trace.so
CUDA_INJECTION64_PATH=$tr KERNEL_TRACE_OUT=$out/serve_trace.csv srv 18110 120b -- 64
python3 tools/gpu/eager_kernels.py $out/serve_trace.csv > $out/eager_serve.txt 2>&1
head -30 $out/eager_serve.txt >> $S
CUDA_INJECTION64_PATH=$tr KERNEL_TRACE_OUT=$out/bench_trace.csv timeout 120 $g bench --device cuda \
  --random-weights 120b --pp 512 --pp-batch 8 --tg '' --runs 2 2>&1 | grep -E "^\| random" >> $S
python3 tools/gpu/eager_kernels.py $out/bench_trace.csv > $out/eager_bench.txt 2>&1
head -30 $out/eager_bench.txt >> $S
rm -f $out/*_trace.csv
ts done
