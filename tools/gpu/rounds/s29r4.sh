# Session 29 (branch s29-fold-tokens): the router fold at 2-4 tokens. Its kernel tests (the
# one-token fold's and the new token counts', padding among them), memcheck, the model tests; the
# step at 1-8 tokens with the fold up to 1 token (GPTOSS_ROUTER_FOLD_TOKENS=1, main's behaviour)
# and up to 4, alternating; the tg128 table with the combine fold (main's 5bf41f5 behaviour at
# one token); the combine fold's MXFP4 gate; route_once at 8-64 tokens (the router's in-step cost).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t fold 200 $K --gtest_filter='Kernels.RouterFoldedIntoOproj*'
grep -E "router fold|combine fold" $out/fold.log >> $S
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t model 200 $bin/test_cuda_model
grep -E "^2-layer" $out/model.log >> $S
ts fold_tokens
for rep in 1 2; do
  for cfg in "120b --dense-dtype fp8" "120b --dense-dtype bf16" "20b --dense-dtype fp8"; do
    for ft in 1 4; do
      echo "== $cfg fold_tokens=$ft" >> $S
      GPTOSS_ROUTER_FOLD_TOKENS=$ft timeout 90 $g bench --device cuda --random-weights $cfg --pp '' --tg 32 --batch 2,3,4 \
        --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
    done
  done
done
ts tg128
for cfg in "120b --dense-dtype bf16" "120b --dense-dtype fp8" "120b --mxfp4-layers all" \
           "20b --dense-dtype bf16" "20b --dense-dtype fp8" "20b --mxfp4-layers all"; do
  echo "== $cfg" >> $S
  timeout 90 $g bench --device cuda --random-weights $cfg --pp '' --tg 128 --batch 1 --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
done
for cf in 1 2 1 2; do
  echo "== 120b mxfp4 combine_fold=$cf" >> $S
  GPTOSS_COMBINE_FOLD=$cf timeout 60 $g bench --device cuda --random-weights 120b --mxfp4-layers all --pp '' --tg 64 \
    --batch 1 --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
done
ts route_once
for sk in "" route_once "" route_once; do
  echo "== 120b fp8 skip '$sk'" >> $S
  GPTOSS_CUDA_SKIP=$sk timeout 120 $g bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 \
    --batch 8,16,32,64 --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
done
ts done
cat $S
