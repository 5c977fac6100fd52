# Session 30, call 8 (main after the fix, GPTOSS_COMBINE_FOLD default 2): where the 8-token
# constant's cost sits (gptoss_host4: kernels sized for 8 tokens, the backend's sums stride, rows
# and default at 4: fast -> the backend's sizes, slow -> the kernels'); the one-token step with the
# new combine-fold default; serving 120b at 4, 8, 32 and 64 streams (issue 14's table).
# Pack: EXTRA_BINS="/tmp/gptoss_host4" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
h4=$bin/gptoss_host4
ts probe
for rep in 1 2; do
  b main $g 120b 64 1 --dense-dtype fp8; b host4 $h4 120b 64 1 --dense-dtype fp8
  b main $g 20b 64 1 --dense-dtype fp8; b host4 $h4 20b 64 1 --dense-dtype fp8
done
ts tg128
b main $g 120b 128 1 --mxfp4-layers all; b main $g 20b 128 1 --mxfp4-layers all
ts serve
serve_cs 120b -- 4 8 32 64
ts done
cat $S
