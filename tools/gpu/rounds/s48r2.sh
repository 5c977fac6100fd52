# Session 48, round 2 (prepared; loans paused after s48r0), on an H200:
# 1. The per-kernel tables that issue 10 asks for, which sessions 42-47 could take only on H100s:
#    the traced one-token step (120b fp8, bf16 with the screen, --mxfp4-layers all; 20b fp8) and
#    the 32-/64-sequence steps (120b bf16).
# 2. The decode router's stage clocks at 32 and 64 sequences (gptoss_router_clocks:
#    tools/gpu/diag_binary.sh router_clocks src/backend/cuda/kernels/moe/route_decode.cu GPTOSS_DIAG_ROUTER_CLOCKS).
# Pack: PACK_TESTS= EXTRA_BINS="build/libgptoss_kernel_trace.so build/diag/gptoss_router_clocks"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
export TRACE_GREP="replay to replay|sum of adds"
left 100 && trace_bench fp8 1 --random-weights 120b --dense-dtype fp8
left 120 && trace_bench bf16 32 --random-weights 120b
left 140 && trace_bench bf16 1 --random-weights 120b
left 160 && trace_bench mxfp4 1 --random-weights 120b --mxfp4-layers all
left 180 && trace_bench bf16 64 --random-weights 120b
left 200 && trace_bench fp8_20b 1 --random-weights 20b --dense-dtype fp8
for x in 32 64; do
  left 240 && { ts "router clocks x$x"
  timeout 60 $bin/gptoss_router_clocks bench --device cuda --random-weights 120b --pp '' --tg 16 --batch $x --runs 1 \
    > $out/rclk$x.txt 2>&1; grep -E "^\| random|router|block|->" $out/rclk$x.txt | head -14 >> $S; }
done
ts done
