# Session 31, call 6 (branch s31-ws-align): the staged dense kernels' (qkv, o_proj at 1-4 tokens)
# shared-memory copy of their first chunks 128-byte aligned (it followed the activation rows, which
# end at 16 mod 128). SkinnyDense and the fold test, memcheck of SkinnyDense at small shapes; the
# step against gptoss_main (main's 8406b62), alternating.
# Pack: EXTRA_BINS="/tmp/gptoss_main" PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
old=$bin/gptoss_main
t kernels 120 $K --gtest_filter='Kernels.SkinnyDense:Kernels.RouterFoldedIntoOproj'
GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.SkinnyDense' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
for rep in 1 2; do
  for f in "--dense-dtype fp8" "" "--mxfp4-layers all"; do b ws128 $g 120b 64 1 $f; b main $old 120b 64 1 $f; done
  b ws128 $g 20b 64 1 --dense-dtype fp8; b main $old 20b 64 1 --dense-dtype fp8
  b ws128 $g 120b 32 2,4 --dense-dtype fp8; b main $old 120b 32 2,4 --dense-dtype fp8
done
ts done
