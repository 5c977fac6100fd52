# Session 36, call 2: the multicast norm-in staging as the default (bf16 with one staged chunk
# group so its grid stays in one wave; the staging's clock now includes the wait for the row).
# The fold and skinny tests, the model tests; the staging clocks at qkv's staged chunk groups 0-2;
# tg128 pairs: multicast against clusters (GPTOSS_NORM_IN_MULTICAST=0), and qkv's staged groups
# 1 against 2 under the multicast.
# Pack: EXTRA_BINS="build/diag/gptoss_mma_clocks" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t skinny_fold 200 $K --gtest_filter='*RouterFolded*:*Skinny*'
t model 150 $bin/test_cuda_model
ts tests
for st in 30 31 32; do
  for mc in 1 0; do
    echo "== clocks 120b fp8 x1 stage=$st mc=$mc" >> $S
    GPTOSS_DENSE_STAGE=$st GPTOSS_NORM_IN_MULTICAST=$mc clocks mma_clocks "norm-in|qkv" 120b --dense-dtype fp8
  done
done
ts clocks
for mf in "120b --dense-dtype fp8" "120b --mxfp4-layers all" "20b --dense-dtype fp8" "120b"; do
  m=${mf%% *}; f=${mf#$m}
  for pass in 1 2; do
    GPTOSS_NORM_IN_MULTICAST=1 RUNS=1 b "mc" $g $m 128 1 $f
    GPTOSS_NORM_IN_MULTICAST=0 RUNS=1 b "clusters" $g $m 128 1 $f
    GPTOSS_DENSE_STAGE=31 RUNS=1 b "mc stage 31" $g $m 128 1 $f
  done
done
ts done
