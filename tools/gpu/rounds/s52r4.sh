# Session 52, round 4 (~7 minutes, any H100 / H200): the decode router asks for its residual rows
# before its router rows where cuBLASLt wrote them (17-64 tokens: the wait returns at once, and the
# rows queued behind 46 KB of router rows a block; thirty-third session's clocks at 32 / 64 tokens:
# 4,500 / 7,700 cycles to the inverse RMS). Bit-equal by construction.
# (1) The router tests (RouterRouteFused runs every variant in both orders, the logits compared bit
# for bit), memcheck and racecheck over it at small shapes. (2) The step x32 / x64 (120b, bf16
# dense), GPTOSS_ROUTER_X_FIRST=0 against the default, alternating, twice. (3) Traced x64, both.
# (4) test_cuda_model.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" EXTRA_BINS="build/libgptoss_kernel_trace.so"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t router 120 $K --gtest_filter='Kernels.RouterRoute*'
sanitize 'Kernels.RouterRouteFused' memcheck racecheck
ts "tests done"
for i in 1 2; do for v in 0 -1; do
  left 300 && GPTOSS_ROUTER_X_FIRST=$v RUNS=1 b "router_x_first=$v" $g 120b 128 32,64
done; done
ts "steps done"
export TRACE_GREP="router_v2|replay to replay"
for v in 0 -1; do left 360 && GPTOSS_ROUTER_X_FIRST=$v trace_bench "router_x_first_$v" 64 --random-weights 120b; done
left 400 && t model 100 $bin/test_cuda_model
ts done
