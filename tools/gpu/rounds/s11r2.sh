set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual|batched decode" $out/$name.log | head -12 >> $S; }
ts tests
t m 240 $bin/test_cuda_model --gtest_filter='CudaModel.*Batched*:CudaModel.Tiny*'
ts kernels
for m in 20b; do for tk in 32 48 64; do
  timeout 120 $g bench-kernels --model $m --tokens $tk --iters 50 > $out/bk_${m}_$tk.log 2>&1
  echo "== $m $tk" >> $S
  grep -E "^\| (qkv|o_proj|lm_head|router) \|" $out/bk_${m}_$tk.log | grep -E "cublas|gemm_mma|gemv" | cut -c1-150 >> $S
  grep -E "skinny_mma (bf16|fp8) \|" $out/bk_${m}_$tk.log | cut -c1-150 >> $S
done; done
ts bench
for m in 20b 120b; do
  for th in 65 33 17; do
    echo "== $m GPTOSS_CUBLAS_MIN_ROWS=$th" >> $S
    GPTOSS_CUBLAS_MIN_ROWS=$th timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 16,32,48,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
  done
done
for th in 65 33; do
  echo "== 20b fp8 GPTOSS_CUBLAS_MIN_ROWS=$th" >> $S
  GPTOSS_CUBLAS_MIN_ROWS=$th timeout 100 $g bench --device cuda --random-weights 20b --dense-dtype fp8 --pp '' --tg 64 --batch 32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
ts done
cat $S
