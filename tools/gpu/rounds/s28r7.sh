# Session 28, round 7 (final): main with the router fold. The kernel tests but attention (untouched;
# every test whose kernels take a MoeRouting, whose layout grew), the speculative-decoding and
# Eagle3 tests, memcheck of the decode expert, router and combine kernels at small shapes; then
# the one-token step with each dense dtype (the fold on, its default).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts kernels
t kernels 250 $K --gtest_filter='-*Attention*'
ts spec
t spec 90 $bin/test_cuda_spec
[ -x $bin/test_cuda_eagle3 ] && t eagle3 60 $bin/test_cuda_eagle3  # (not packed: the carry limit)
ts memcheck
GPTOSS_TEST_SMALL=1 timeout 100 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.Skinny*:Kernels.Moe*:Kernels.Router*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
ts steps
for m in 120b 20b; do
  for flags in "--dense-dtype bf16" "--dense-dtype fp8" "--mxfp4-layers all"; do
    echo "== $m $flags" >> $S
    timeout 60 $g bench --device cuda --random-weights $m $flags --pp '' --tg 128 --batch 1 --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
  done
done
ts done
cat $S
