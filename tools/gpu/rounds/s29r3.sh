# Session 29, main with the combine fold (5bf41f5): the one-token step at tg128 in every dense
# dtype (the table's figures), GPTOSS_COMBINE_FOLD=2 against 1 with MXFP4 dense layers (the gate),
# and what the router's launch costs at 2-64 tokens inside the step (GPTOSS_CUDA_SKIP=route_once:
# layers past 0 reuse layer 0's routing; every sequence has its own random prompt, so the experts
# touched stay those of distinct tokens): the upper bound for folding it at those sizes.
# Pack: PACK_TESTS="test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tg128
for cfg in "120b --dense-dtype bf16" "120b --dense-dtype fp8" "120b --mxfp4-layers all" \
           "20b --dense-dtype bf16" "20b --dense-dtype fp8" "20b --mxfp4-layers all"; do
  echo "== $cfg" >> $S
  timeout 90 $g bench --device cuda --random-weights $cfg --pp '' --tg 128 --batch 1 --runs 3 2>&1 | grep -E "^\| random|rror" >> $S
done
for rep in 1 2; do
  for cf in 1 2; do
    echo "== 120b mxfp4 combine_fold=$cf" >> $S
    GPTOSS_COMBINE_FOLD=$cf timeout 60 $g bench --device cuda --random-weights 120b --mxfp4-layers all --pp '' --tg 64 \
      --batch 1 --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
  done
done
ts route_once
for cfg in "120b --dense-dtype fp8" "20b --dense-dtype fp8"; do
  for rep in 1 2; do
    for sk in "" route_once; do
      echo "== $cfg skip '$sk'" >> $S
      GPTOSS_CUDA_SKIP=$sk timeout 120 $g bench --device cuda --random-weights $cfg --pp '' --tg 32 --batch 2,4,8,16,32,64 \
        --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
    done
  done
done
ts model
t model 200 $bin/test_cuda_model
grep -E "^2-layer" $out/model.log >> $S
ts done
cat $S
