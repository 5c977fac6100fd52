# Session 38, round 6: the tensor-core decode attention's one-split plans on the kernel without the
# cluster merge's receive rows (54 KB a bf16 block: four an SM, not three), storing its output rows
# itself (no merge launch). s38r5: at 64 sequences the full layers' 512 blocks took 24.5 us + a
# 3.2 us merge, the sliding layers' 15.7 us, in two waves. Tests (plans against the CPU; memcheck);
# traced steps at 32 and 64 sequences, HEAD 29d821b's binary (gptoss_base: the same decode code
# as 1788bd7) and this one; bench tg128 at 1, 32, 64 alternating. (Trimmed to the device time left:
# no sanitizer, no serving.)
# Pack: EXTRA_BINS="/tmp/bb/gptoss_base build/libgptoss_kernel_trace.so" PACK_TESTS=test_cuda_kernels tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t attn 200 $K --gtest_filter='*AttentionDecodeFused:*AttentionDecodeStored:*DecodeAttentionPlan*'
ts trace
export TRACE_GREP="replay to replay|attention|sum of adds"
for n in 64 32; do
  g=$bin/gptoss_base trace_bench base $n --random-weights 120b
  trace_bench new $n --random-weights 120b
done
ts bench
for n in 1 32 64; do
  RUNS=1 b base $bin/gptoss_base 120b 128 $n
  RUNS=1 b new $g 120b 128 $n
done
ts done
