# Prepared in session 29 (main after its review, not run on a GPU): the fold's expert blocks
# sort their pairs with the decode router's moe_sort_warp into shared memory instead of a copy of
# its ranking (the duplicates tool's pair). Its kernel tests (one and 2-8 tokens, padding), memcheck,
# the model tests, and the step at 2-8 tokens against main's (GPTOSS_ROUTER_FOLD_TOKENS=1 / 8).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t fold 240 $K --gtest_filter='Kernels.RouterFoldedIntoOproj*:Kernels.RouterRoute*'
grep -E "router fold" $out/fold.log >> $S
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t model 200 $bin/test_cuda_model
grep -E "^2-layer" $out/model.log >> $S
ts steps
for rep in 1 2; do
  for ft in 1 8; do
    echo "== 120b fp8 fold_tokens=$ft" >> $S
    GPTOSS_ROUTER_FOLD_TOKENS=$ft timeout 90 $g bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 \
      --batch 1,2,3,4,6,8 --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
  done
done
ts done
cat $S
