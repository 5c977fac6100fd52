# Session 48, round 1 (an H200 came in s48r0, which ran s45r1: issue 10's bf16 targets met with the
# lm_head screen, 554.4-554.9 / 806.9-809.3 tok/s): the H200's own per-kernel tables, which issue 10
# asks for and which sessions 42-47 could take only on H100s.
# - the traced one-token step: 120b fp8, bf16 (screen on), --mxfp4-layers all; 20b fp8;
# - the traced 32- and 64-sequence steps (120b, bf16 dense layers: what serving runs);
# - bench-kernels' expert rows at 32 and 64 tokens (1 and 8 came in s48r0).
# Each trace report is kept whole in $OUT (r_NAME_BATCH.txt).
# - the decode router's stage clocks at 32 and 64 sequences (diagnostic binary gptoss_router_clocks:
#   tools/gpu/diag_binary.sh router_clocks src/backend/cuda/kernels/moe/route_decode.cu GPTOSS_DIAG_ROUTER_CLOCKS).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec"
#   EXTRA_BINS="build/libgptoss_kernel_trace.so build/diag/gptoss_router_clocks"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
export TRACE_GREP="replay to replay|sum of adds"
trace_bench fp8 1 --random-weights 120b --dense-dtype fp8
trace_bench bf16 1 --random-weights 120b
trace_bench mxfp4 1 --random-weights 120b --mxfp4-layers all
trace_bench fp8_20b 1 --random-weights 20b --dense-dtype fp8
trace_bench bf16 32 --random-weights 120b
trace_bench bf16 64 --random-weights 120b
for tk in 32 64; do
  left 400 && { timeout 90 $g bench-kernels --model 120b --tokens $tk --iters 20 > $out/bk$tk.txt 2>&1
  grep -E "gate_up \+ down|plain read|router \+ route" $out/bk$tk.txt | head -40 >> $S; }
done
for x in 32 64; do
  left 450 && { ts "router clocks x$x"
  timeout 100 $bin/gptoss_router_clocks bench --device cuda --random-weights 120b --pp '' --tg 16 --batch $x --runs 1 \
    > $out/rclk$x.txt 2>&1; grep -E "^\| random|router|block|->" $out/rclk$x.txt | head -14 >> $S; }
done
ts done
