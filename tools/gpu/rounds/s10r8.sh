set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
nccl_lib=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$bin/lib:$nccl_lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
export NCCL_NVLS_ENABLE=0
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S; }
GPTOSS_DENSE_TWO_TILE=7 CUDA_VISIBLE_DEVICES=0 t k 150 $K --gtest_filter='Kernels.SkinnyDense*'
for b in 1 3; do for m in 120b 20b; do
  ts "mxfp4-all $m bits $b"
  GPTOSS_DENSE_TWO_TILE=$b CUDA_VISIBLE_DEVICES=0 timeout 80 $g bench --device cuda --random-weights $m --mxfp4-layers all --pp '' --tg 64 --batch 1,8 --runs 2 2>&1 | grep -E "^\| random" >> $S
done; done
for b in 1 5; do
  ts "tp2 bits $b"
  GPTOSS_DENSE_TWO_TILE=$b timeout 150 $g bench --device cuda --random-weights 120b --tp 2 --pp '' --tg 128 --batch 1,8,32 --runs 2 2>&1 | grep -E "^\| random" >> $S
done
GPTOSS_DENSE_TWO_TILE=5 t tp 200 $bin/test_cuda_tp --gtest_filter='*Model*'
ts done
cat $S
