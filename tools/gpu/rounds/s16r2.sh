# Session 16, round 2: staging on by default (o_proj 2, qkv 2 chunk groups at 1-4 tokens);
# against off (0) and o_proj 3 (32), and the tests of the candidate binaries.
source tools/gpu/rounds/prelude.sh
ts bench
b() { local tag=$1; shift; timeout 100 $g bench --device cuda --random-weights "$@" --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/$tag /" >> $S; }
for st in 0 22 32 0 22 32; do GPTOSS_DENSE_STAGE=$st b "120b st$st" 120b --batch 1,2,4,8; done
GPTOSS_DENSE_STAGE_ROWS=8 b "120b st22 rows8" 120b --batch 8
for st in 0 22 32 0 22; do GPTOSS_DENSE_STAGE=$st b "20b st$st" 20b --batch 1,2,4; done
for m in 120b 20b; do for st in 0 22 0 22; do GPTOSS_DENSE_STAGE=$st b "$m fp8 st$st" $m --dense-dtype fp8 --batch 1; done; done
ts tests
t skinny_default 120 $K --gtest_filter=Kernels.SkinnyDense
GPTOSS_DENSE_STAGE=34 t skinny_st34 120 $K --gtest_filter=Kernels.SkinnyDense
GPTOSS_DENSE_STAGE=13 GPTOSS_DENSE_STAGE_ROWS=8 t skinny_st13r8 120 $K --gtest_filter=Kernels.SkinnyDense
t model 240 $bin/test_cuda_model
t spec 150 $bin/test_cuda_spec
ts attention
left=$((585 - (SECONDS - T0))); t attention $left $K --gtest_filter='Kernels.Attention*:Kernels.Flash*'
grep -c "^\[       OK" $out/attention.log >> $S
ts done
rm -f $out/*.log
cat $S
