set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
nccl_lib=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$bin/lib:$nccl_lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
export NCCL_NVLS_ENABLE=0
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem --format=csv >> $S
nvidia-smi topo -m | head -4 >> $S
for mode in 0 1 4; do
  ts "bench-kernels 120b 1 token mode $mode"
  CUDA_VISIBLE_DEVICES=0 GPTOSS_L2_PREFETCH=$mode timeout 100 $g bench-kernels --model 120b --tokens 1 --iters 50 > $out/bk1_$mode.log 2>&1
done
ts "bench-kernels 120b 32 tokens mode 4"
CUDA_VISIBLE_DEVICES=0 GPTOSS_L2_PREFETCH=4 timeout 100 $g bench-kernels --model 120b --tokens 32 --iters 50 > $out/bk32_4.log 2>&1
for mode in 0 4 5 6; do
  ts "bench 120b mode $mode"
  CUDA_VISIBLE_DEVICES=0 GPTOSS_L2_PREFETCH=$mode timeout 100 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,8,32 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
export GPTOSS_L2_PREFETCH=0
ts "TP: bench-allreduce"
timeout 120 $g bench-allreduce --gpus 2 > $out/allreduce.md 2>&1; grep -E "^\|" $out/allreduce.md | head -14 >> $S
for tp in 1 2; do
  ts "bench 120b tp $tp"
  timeout 200 $g bench --device cuda --random-weights 120b --pp 512,2048 --tg 128 --batch 1,32 --runs 1 --tp $tp 2>&1 | grep -E "^\| random" >> $S
done
ts "bench 120b tp 2 expert"
timeout 200 $g bench --device cuda --random-weights 120b --pp 2048 --tg 128 --batch 1,32 --runs 1 --tp 2 --tp-expert-sharding expert 2>&1 | grep -E "^\| random" >> $S
ts "test_cuda_tp"
timeout 200 $bin/test_cuda_tp --gtest_color=no > $out/tp.log 2>&1; echo "tp rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure" $out/tp.log | head >> $S
ts done
cat $S
