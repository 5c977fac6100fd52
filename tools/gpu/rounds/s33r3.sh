# Session 33, call 3: the kernels around the experts at 32 and 64 tokens (120b fp8, traced): the
# router's shapes (GPTOSS_ROUTER_KERNEL: c16s is the default; old = route.cu's kernels) and the
# decode attention's plans (GPTOSS_DECODE_ATTENTION=split; GPTOSS_DECODE_WAVE, the most blocks a
# cluster plan launches: 528 now, 1056-4224 allow clusters of 2-8 splits at 32-64 sequences), each
# as what it adds to the replayed step.
# Pack: EXTRA_BINS="build/libgptoss_kernel_trace.so" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
export TRACE_GREP="replay to replay|router|route|sort|attention|merge|sum of adds"
tr() { trace_bench "$1" "$2" --random-weights 120b --dense-dtype fp8; }
for b in 32 64; do
  tr default $b
  for v in old c8 c16 c8x c8s; do GPTOSS_ROUTER_KERNEL=$v tr router_$v $b; done
  GPTOSS_DECODE_ATTENTION=split tr attn_split $b
  for w in 1056 2112 4224; do GPTOSS_DECODE_WAVE=$w tr attn_wave$w $b; done
done
ts done
