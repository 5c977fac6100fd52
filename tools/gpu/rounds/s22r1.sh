# Prepared in session 21 for the next GPU session (not run): every cuda test on HEAD (the
# 16-token-pass selection, 6e597c0, and the launcher review, 0359b3c, were committed after the
# device time was spent), then serving on the final defaults: 20b and 120b at 32 and 64 streams,
# the 16-token passes off / on (GPTOSS_WARP_UNITS_16=0|7), and the step at 48-64 tokens.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" bash .gpu-carry-pack/pack.sh
# Expected ~9 minutes for check.sh: give it its own call, then the rest in a second.
source tools/gpu/rounds/prelude.sh
if [ "${1:-check}" = check ]; then
  ts check.sh
  bash tools/gpu/check.sh --prebuilt $bin --no-bench --no-sanitizer 2>&1 | tail -14 >> $S
else
  for w in 0 7 0 7; do
    ts step 20b warp_units_16 $w
    GPTOSS_WARP_UNITS_16=$w timeout 60 $g bench --device cuda --random-weights 20b --pp '' --tg 32 --batch 48,56,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
  for w in 0 7; do ts serve 20b warp_units_16 $w; GPTOSS_WARP_UNITS_16=$w serve_cs 20b -- 32 64; done
  ts serve 120b; serve_cs 120b -- 32 64
fi
ts done
rm -f $out/*.log
cat $S
