# Session 52, round 2 (~8 minutes, any H100 / H200): the decode attention's q, k, v row asked for
# before its ring of K/V tiles where cuBLASLt wrote qkv (17-64 tokens: its wait returns at once,
# and the row queued behind the ring's 48 KB a block; forty-sixth session's clocks at 64 sequences:
# 6,700 / 9,900 cycles for the row against a 1,300-cycle rope and store).
# (1) The new test (both orders bit-equal, fused and stored, every plan shape; row-first against
# the CPU) and the decode attention tests. (2) The step x32 / x64 (120b, bf16 dense),
# GPTOSS_ATTN_ROW_FIRST=0 (the old order) against the default (row first from 17 tokens),
# alternating, twice; x1 once each (unchanged by construction: the one-token qkv launches it early).
# (3) Traced x64 steps, both orders: the attention kernels' adds a layer.
# Pack: PACK_TESTS="test_cuda_kernels" EXTRA_BINS="build/libgptoss_kernel_trace.so"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t attn 200 $K --gtest_filter='Kernels.AttentionDecodeRowFirstMatchesRingFirst:Kernels.AttentionDecodeFused:Kernels.AttentionDecodeStored:Kernels.AttentionDecodeStoredMatchesFused'
ts "tests done"
for i in 1 2; do for v in 0 -1; do
  left 330 && GPTOSS_ATTN_ROW_FIRST=$v RUNS=1 b "row_first=$v" $g 120b 128 32,64
done; done
for v in 0 -1; do left 360 && GPTOSS_ATTN_ROW_FIRST=$v RUNS=1 b "row_first=$v" $g 120b 128 1; done
ts "steps done"
export TRACE_GREP="attention_decode|replay to replay"
for v in 0 -1; do left 420 && GPTOSS_ATTN_ROW_FIRST=$v trace_bench "row_first_$v" 64 --random-weights 120b; done
ts done
