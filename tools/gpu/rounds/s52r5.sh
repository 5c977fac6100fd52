# Session 52, round 5 (~3 minutes, any H100 / H200): s52r4 found gate_up 5.2 us a layer slower at
# 64 tokens when the router triggered ~2 us sooner (its x-first order; step x64 -0.8%). Does a
# later trigger buy the reverse? GPTOSS_ROUTER_TRIGGER=1: the router lets the expert kernel launch
# only at its end. The step x32 / x64 (120b, bf16 dense) both ways, alternating, twice; traced x64.
# Pack: PACK_TESTS= EXTRA_BINS="build/libgptoss_kernel_trace.so"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
for i in 1 2; do for v in 0 1; do
  left 200 && GPTOSS_ROUTER_TRIGGER=$v RUNS=1 b "router_trigger=$v" $g 120b 128 32,64
done; done
export TRACE_GREP="skinny_warp|router_v2|replay to replay"
for v in 0 1; do left 260 && GPTOSS_ROUTER_TRIGGER=$v trace_bench "router_trigger_$v" 64 --random-weights 120b; done
ts done
