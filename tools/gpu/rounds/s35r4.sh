# Session 35, call 4: the cluster staging with its sums by butterfly (and each block's reads'
# sums by butterfly too): the fold tests at each cluster size, the staging clocks, tg128 pairs.
# Pack: EXTRA_BINS="build/diag/gptoss_mma_clocks" PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for cl in 1 2 4 8 16; do
  GPTOSS_NORM_IN_CLUSTER=$cl t fold_cl$cl 120 $K --gtest_filter='*RouterFolded*'
done
for cl in 1 2 4 8 16; do
  echo "== mma clocks 120b fp8 x1 cluster $cl" >> $S
  GPTOSS_NORM_IN_CLUSTER=$cl timeout 100 $bin/gptoss_mma_clocks bench --device cuda --random-weights 120b --dense-dtype fp8 \
    --pp '' --tg 64 --batch 1 --runs 1 2>&1 | grep -E "^\| random|qkv|norm-in" | sed -E 's/mean cycles a block://' |
    awk '!seen[$0]++' >> $S
done
for pass in 1 2; do
  for cl in 1 2 4 8; do GPTOSS_NORM_IN_CLUSTER=$cl b "cl$cl" $g 120b 128 1 --dense-dtype fp8; done
done
for mf in "120b" "120b --mxfp4-layers all" "20b --dense-dtype fp8"; do
  m=${mf%% *}; f=${mf#$m}
  for cl in 1 4 2 1 4 2; do GPTOSS_NORM_IN_CLUSTER=$cl b "cl$cl" $g $m 128 1 $f; done
done
ts done
