# Session 21, second round: the warp-per-tile walk (skinny_warp_units_kernel). s21r1 showed that
# 12 chunks in flight a warp (twice the bytes of the default) made the K-split unit kernel slower
# at every size, so its 1.25-1.8x over its reads is not the memory round trips of its chunk chain.
# What is left is each unit's fixed part: the reduction of the 8 K slices through shared memory
# behind two barriers, and the finishing warps' epilogue, every 5-6 chunk steps. The warp walk
# has none: a warp owns whole row tiles over all of K (45 chunk steps a unit), stores its own
# rows, and its ring carries straight into the next unit; the block meets only at a new pass.
# Variants: 20 the ks1 block-per-tile reference (bit for bit), 21 rt1 pf4 (24 warps an SM),
# 22 rt1 pf8 (16), 23 rt2 pf4 (16), 24 rt1 pf4 (32 warps, 4 bytes spilled).
# Pack: PACK_TESTS="test_cuda_kernels" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
t units_tests 200 $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.MoeMxfp4FragmentsDecode*'
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no \
  --gtest_filter='Kernels.SkinnyUnits*' > $out/san.txt 2>&1
echo "memcheck rc=$? $(tail -1 $out/san.txt)" >> $S
for mt in "20b 1" "20b 8" "20b 32" "20b 64" "120b 1" "120b 8" "120b 32" "120b 64"; do
  set -- $mt; ts bench-kernels $1 $2
  timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 50 2>&1 | grep -E "experts (gate_up|down) \(mxfp4\)" |
    grep -E "units ks8 rt6 pf1|warp units|ks1 rt1" >> $S
done
for m in 20b 120b; do
  for v in 0 21 22 23 24 0; do
    ts step $m variant $v
    GPTOSS_SKINNY_VARIANT=$v timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
ts done
rm -f $out/*.log $out/san.txt
cat $S
