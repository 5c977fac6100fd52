# Session 34, call 6: 120b serving (bf16 dense, 32 and 64 streams, 512 in / 256 out) with the
# session's binary (gptoss: the top-k merge and the folded o_proj's residual copy) against
# the session's base (gptoss_base: aa24fb1's kernels), alternating.
# Pack: EXTRA_BINS="/tmp/gptoss_base" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
new=$g
for rep in 1 2; do
  for which in new base; do
    [ $which = new ] && g=$new || g=$bin/gptoss_base
    ts "serve $which"
    serve_cs 120b -- 32 64
  done
done
ts done
