# Session 16, round 3: staging default 32 (o_proj 3, qkv 2 chunk groups at 1-4 tokens): SkinnyDense
# with 3- and 4-token cases; CudaModel.WideBatchedDecodeEqualsAlone repeated (round 2 saw it fail
# once on the tiny fixture, which staging does not touch); the step against staging off.
source tools/gpu/rounds/prelude.sh
ts tests
t skinny_default 120 $K --gtest_filter=Kernels.SkinnyDense
timeout 150 $bin/test_cuda_model --gtest_filter=CudaModel.WideBatchedDecodeEqualsAlone:CudaModel.BatchedDecodeEqualsAlone --gtest_repeat=8 --gtest_color=no > $out/wide.log 2>&1
echo "wide rc=$? ok=$(grep -c '^\[       OK' $out/wide.log) failed=$(grep -c '^\[  FAILED  \] CudaModel' $out/wide.log)" >> $S
grep -E "rel err" $out/wide.log | awk '{e=$NF; if (e+0 > 0.005) print}' | head -12 >> $S
grep -E "rel err" $out/wide.log | awk '{e=$NF; if (e+0 > m) m=e+0} END {print "max rel err", m, "of", NR}' >> $S
ts bench
b() { local tag=$1; shift; timeout 100 $g bench --device cuda --random-weights "$@" --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/$tag /" >> $S; }
for m in 120b 20b; do for st in 0 32 0 32; do GPTOSS_DENSE_STAGE=$st b "$m st$st" $m --batch 1,2,4; done; done
for m in 120b 20b; do for st in 0 32; do GPTOSS_DENSE_STAGE=$st b "$m fp8 st$st" $m --dense-dtype fp8 --batch 1; done; done
ts done
rm -f $out/*.log
cat $S
