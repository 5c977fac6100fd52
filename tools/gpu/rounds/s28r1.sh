# Prepared in session 27 for the next session's first round: HEAD's model tests (the dense MXFP4
# staging merged in session 27 ran its kernel tests, not these), then each op group's cost inside
# the graphed step (GPTOSS_CUDA_SKIP leaves a group out; outputs are garbage, so "router" only
# goes with "experts", whose routing it writes): the ceiling of any fusion of the one-token step.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t model 150 $bin/test_cuda_model
t dense 120 $K --gtest_filter='Kernels.SkinnyDense'
ts skip
for sk in "" attn dense experts router,experts lm_head; do
  echo "== skip '$sk'" >> $S
  GPTOSS_CUDA_SKIP=$sk timeout 60 $g bench --device cuda --random-weights 120b --pp '' --tg 32 --batch 1,64 --runs 2 2>&1 \
    | grep -E "^\| random" >> $S
done
ts skip fp8
for sk in "" attn dense experts router,experts; do
  echo "== fp8 skip '$sk'" >> $S
  GPTOSS_CUDA_SKIP=$sk timeout 60 $g bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 --batch 1 --runs 2 2>&1 \
    | grep -E "^\| random" >> $S
done
ts done
cat $S
