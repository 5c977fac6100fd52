# Session 16, round 1: dense decode copies (qkv, o_proj) with their first chunks staged in shared
# memory by the bulk-copy engine before griddepcontrol.wait (GPTOSS_DENSE_STAGE = o_proj digit,
# qkv digit); then main's GPU tests (never run on the 14th session's last commits) and the staged kernels' tests.
source tools/gpu/rounds/prelude.sh
ts bench
b() { local tag=$1; shift; timeout 100 $g bench --device cuda --random-weights "$@" --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/$tag /" >> $S; }
for st in 0 11 22 33 24 0 22; do GPTOSS_DENSE_STAGE=$st b "120b st$st" 120b --batch 1,8; done
for st in 0 22 33; do GPTOSS_DENSE_STAGE=$st b "20b st$st" 20b --batch 1,8; done
for st in 0 22; do GPTOSS_DENSE_STAGE=$st b "120b fp8 st$st" 120b --dense-dtype fp8 --batch 1; done
ts tests
GPTOSS_DENSE_STAGE=33 t skinny_st33 120 $K --gtest_filter=Kernels.SkinnyDense
GPTOSS_DENSE_STAGE=24 t skinny_st24 120 $K --gtest_filter=Kernels.SkinnyDense
GPTOSS_DENSE_STAGE=22 t model_st22 200 $bin/test_cuda_model --gtest_filter=CudaModel.TwoLayers120bShapesMatchCpu:CudaModel.BatchedDecodeEqualsAlone:CudaModel.BatchInvariantDecodeIsExact
ts check
OUT=$out/check bash tools/gpu/check.sh --prebuilt .gpu-carry --no-bench --no-sanitizer > $out/check.txt 2>&1
echo "check rc=$?" >> $S; grep -E "PASSED|FAILED|rc=|passed|failed" $out/check.txt | tail -12 >> $S
ts done
rm -rf $out/check $out/*.log $out/check.txt
cat $S
