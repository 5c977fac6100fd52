# Session 21, sixth round (the last ~5 device minutes): the warp walk with 16-token passes. At 20b x64
# a group holds ~8 tokens and ~40% of groups take a second 8-token pass, so the walk reads and
# decodes their weights twice; variants 25 / 26 (ring 8 / 6) make a pass 16 tokens and run both
# n-tiles on each decoded chunk where a unit holds more than 8 (one n-tile otherwise). Bit for bit
# (the units test), then bench-kernels and the step at 48-64 tokens against the default.
# Pack: PACK_TESTS="test_cuda_kernels" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
t units_test 100 $K --gtest_filter='Kernels.SkinnyUnits*'
for mt in "20b 48" "20b 64" "120b 64"; do
  set -- $mt; ts bench-kernels $1 $2
  timeout 60 $g bench-kernels --model $1 --tokens $2 --iters 50 2>&1 | grep -E "experts (gate_up|down) \(mxfp4\)" |
    grep -E "warp units rt1 pf(8|6) 16w" >> $S
done
for v in 0 25 26 0; do
  ts step 20b variant $v
  GPTOSS_SKINNY_VARIANT=$v timeout 60 $g bench --device cuda --random-weights 20b --pp '' --tg 32 --batch 48,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
done
for v in 0 25; do
  ts step 120b variant $v
  GPTOSS_SKINNY_VARIANT=$v timeout 60 $g bench --device cuda --random-weights 120b --pp '' --tg 32 --batch 32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
done
ts done
rm -f $out/*.log
cat $S
