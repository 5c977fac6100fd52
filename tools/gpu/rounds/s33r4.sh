# Session 33, call 4: (1) where the router's time goes at 16-64 tokens (diagnostic binary
# gptoss_router_clocks: tools/gpu/diag_binary.sh router_clocks src/backend/cuda/kernels/moe/route_decode.cu
# GPTOSS_DIAG_ROUTER_CLOCKS; clock64 at each stage of router_v2_kernel, mean cycles a block at exit);
# (2) the decode attention's cluster merge against split-and-merge (GPTOSS_DECODE_ATTENTION=split)
# at 4-48 sequences, traced (s33r3: at 32, split saved ~10 us a full layer).
# Pack: EXTRA_BINS="build/diag/gptoss_router_clocks build/libgptoss_kernel_trace.so" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for bt in 16 32 64; do
  echo "== router clocks 120b fp8 x$bt" >> $S
  timeout 100 $bin/gptoss_router_clocks bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 \
    --batch $bt --runs 1 2>&1 | grep -E "^\| random|router clocks" | sed -E 's/mean cycles a block://' >> $S
done
export TRACE_GREP="replay to replay|attention|sum of adds" TRACE_NODES_GREP="attention|combine_kernel"
tr() { trace_bench "$1" "$2" --random-weights 120b --dense-dtype fp8; }
for bt in 4 8 16 24 32 48; do
  tr cluster $bt
  GPTOSS_DECODE_ATTENTION=split tr split $bt
done
ts done
