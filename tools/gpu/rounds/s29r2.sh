# Prepared in session 28 (branch s28-combine-fold, not measured yet): the combine folded into the
# next layer at one token (RouterFold::moe_out, NormIn): down adds the weighted expert rows into
# fixed-point sums, the next qkv normalizes x + those sums as it stages its row, the next o_proj adds
# them to the residual; no combine launch but the last layer's. Its kernel test (the router fold's,
# with the chain), memcheck, the model tests; then the step with it off (GPTOSS_COMBINE_FOLD=0) and
# on, alternating; each op group's in-graph cost (s29r1's, folded in here). Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t fold 120 $K --gtest_filter='Kernels.RouterFoldedIntoOproj'
grep -E "router fold|combine fold" $out/fold.log >> $S
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t model 200 $bin/test_cuda_model
grep -E "^2-layer" $out/model.log >> $S
ts steps
for rep in 1 2; do
  for cfg in "120b --dense-dtype bf16" "120b --dense-dtype fp8" "120b --mxfp4-layers all" "20b --dense-dtype fp8"; do
    for cf in 0 1; do
      echo "== $cfg combine_fold=$cf" >> $S
      GPTOSS_COMBINE_FOLD=$cf timeout 60 $g bench --device cuda --random-weights $cfg --pp '' --tg 64 --batch 1 --runs 2 2>&1 \
        | grep -E "^\| random|rror" >> $S
    done
  done
done
ts skips
# Each op group's in-graph cost beside it (GPTOSS_CUDA_SKIP turns the combine fold off; the router
# fold stays on where its kernels run): the step with the combine fold off, then without each group.
for cfg in "120b --dense-dtype fp8" "20b --dense-dtype fp8"; do
  for sk in "" combine attn dense experts; do
    echo "== $cfg combine_fold=0 skip '$sk'" >> $S
    GPTOSS_COMBINE_FOLD=0 GPTOSS_CUDA_SKIP=$sk timeout 60 $g bench --device cuda --random-weights $cfg --pp '' --tg 64 --batch 1 \
      --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
  done
done
ts done
cat $S
