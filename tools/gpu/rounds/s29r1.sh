# Prepared in session 28 for the next session's first round: where the one-token step's time goes
# now that the router is folded into o_proj. Each op group's in-graph cost (GPTOSS_CUDA_SKIP; at one
# token every routing reads 4 experts, so the bytes do not change), the combine's launch among them
# (GPTOSS_CUDA_SKIP=combine: the most a fold of the combine into the next qkv and o_proj can save),
# alternating with the whole step; 120b with fp8 and bf16 dense layers, 20b with fp8. (Without the
# experts the fold is off and the router launches: that row is the experts and combine less a router.)
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
for rep in 1 2; do
  for cfg in "120b --dense-dtype fp8" "120b --dense-dtype bf16" "20b --dense-dtype fp8"; do
    for sk in "" combine attn dense experts; do
      echo "== $cfg skip '$sk'" >> $S
      GPTOSS_CUDA_SKIP=$sk timeout 60 $g bench --device cuda --random-weights $cfg --pp '' --tg 64 --batch 1 --runs 2 2>&1 \
        | grep -E "^\| random|rror" >> $S
    done
  done
done
ts done
cat $S
