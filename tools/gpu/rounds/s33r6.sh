# Session 33, call 6: 120b serving (bf16 dense, 32 and 64 streams, 512 in / 256 out) with this
# session's binary (gptoss) against main before the session (b951ddb: gptoss_main, without the
# pushed attention merge, the router spread or the attention plans' wave), alternating.
# Pack: EXTRA_BINS="/tmp/gptoss_main" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
new=$g
for rep in 1 2; do
  for which in new main; do
    [ $which = new ] && g=$new || g=$bin/gptoss_main
    ts "serve $which"
    serve_cs 120b -- 32 64
  done
done
ts done
