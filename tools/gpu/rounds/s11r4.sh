set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
ts bench
for m in 20b 120b; do
  for cfg in "65 65" "17 64" "17 17" "33 64" "17 64"; do
    set -- $cfg
    echo "== $m MIN_ROWS=$1 MIN_ROWS_O=$2" >> $S
    GPTOSS_CUBLAS_MIN_ROWS=$1 GPTOSS_CUBLAS_MIN_ROWS_O=$2 timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 24,32,48,64 --runs 2 2>&1 | grep -E "^\| random" >> $S
  done
done
ts profile
for cfg in "17 64" "17 17" "65 65"; do
  set -- $cfg
  echo "== profile 20b x32 MIN_ROWS=$1 MIN_ROWS_O=$2" >> $S
  GPTOSS_CUDA_PROFILE=1 GPTOSS_CUBLAS_MIN_ROWS=$1 GPTOSS_CUBLAS_MIN_ROWS_O=$2 timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 16 --batch 32 --runs 1 > $out/prof_$1_$2.log 2>&1
  grep -A20 "decode-size passes" $out/prof_$1_$2.log >> $S
done
ts done
cat $S
