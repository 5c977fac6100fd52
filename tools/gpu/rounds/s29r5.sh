# Session 29 (branch s29-fold-tokens): the router fold at up to 8 tokens, the warp walk taking it
# at 2-8 (gate_up from 3 tokens, down from 6). Kernel tests (one token, 2-8 tokens with padding),
# memcheck, the model tests (the batched 120b-shape check among them); the step at 2-8 tokens
# with the fold up to 1, 4 and 8 tokens (GPTOSS_ROUTER_FOLD_TOKENS), alternating.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t fold 240 $K --gtest_filter='Kernels.RouterFoldedIntoOproj*'
grep -E "router fold|combine fold" $out/fold.log >> $S
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t model 200 $bin/test_cuda_model
grep -E "^2-layer" $out/model.log >> $S
ts fold_tokens
for rep in 1 2; do
  for cfg in "120b --dense-dtype fp8" "120b --dense-dtype bf16" "20b --dense-dtype fp8"; do
    for ft in 1 4 8; do
      echo "== $cfg fold_tokens=$ft" >> $S
      GPTOSS_ROUTER_FOLD_TOKENS=$ft timeout 90 $g bench --device cuda --random-weights $cfg --pp '' --tg 32 \
        --batch 2,3,4,5,6,8 --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
    done
  done
done
ts done
cat $S
