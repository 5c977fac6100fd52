# Session 34, call 1 (prepared in session 33): the one-token gate_up's first 4.2 us split into the
# wait for o_proj (with the router folded in) and the routing itself (gptoss_units_clocks, now with
# a "waited" stage), and the router's stages at 32-64 tokens after the token spread
# (gptoss_router_clocks). Build both diagnostic binaries first:
#   tools/gpu/diag_binary.sh units_clocks src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_UNITS_CLOCKS
#   tools/gpu/diag_binary.sh router_clocks src/backend/cuda/kernels/moe/route_decode.cu GPTOSS_DIAG_ROUTER_CLOCKS
# Pack: EXTRA_BINS="build/diag/gptoss_units_clocks build/diag/gptoss_router_clocks build/libgptoss_kernel_trace.so" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for mf in "120b --dense-dtype fp8" "120b" "20b --dense-dtype fp8"; do
  m=${mf%% *}; f=${mf#$m}
  echo "== units clocks $m x1 $f" >> $S
  timeout 100 $bin/gptoss_units_clocks bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1 --runs 1 $f 2>&1 |
    grep -E "^\| random|units clocks" | sed -E 's/mean cycles a block://' >> $S
done
for bt in 32 64; do
  echo "== router clocks 120b fp8 x$bt" >> $S
  timeout 100 $bin/gptoss_router_clocks bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 \
    --batch $bt --runs 1 2>&1 | grep -E "^\| random|router clocks" | sed -E 's/mean cycles a block://' >> $S
done
ts done
# And the one-token and 32-token steps traced kernel by kernel (the whole reports come back as files).
export TRACE_GREP="replay to replay|sum of adds"
trace_bench fp8 1 --random-weights 120b --dense-dtype fp8
trace_bench fp8 32 --random-weights 120b --dense-dtype fp8
trace_bench 20bfp8 1 --random-weights 20b --dense-dtype fp8
ts traced
