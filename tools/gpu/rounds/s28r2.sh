# Session 28, round 2: the router's launches inside the one-token step. GPTOSS_CUDA_SKIP=route_once
# runs the router in layer 0 only (the other layers reuse its routing): the most any fold of the
# router into its neighbours can save. Alternating, bf16 and fp8 dense layers, 120b and 20b.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
for rep in 1 2; do
  for m in 120b 20b; do
    for dd in bf16 fp8; do
      for sk in "" route_once; do
        echo "== $m $dd skip '$sk'" >> $S
        GPTOSS_CUDA_SKIP=$sk timeout 60 $g bench --device cuda --random-weights $m --dense-dtype $dd --pp '' --tg 64 --batch 1,8 --runs 2 2>&1 \
          | grep -E "^\| random" >> $S
      done
    done
  done
done
ts done
cat $S
