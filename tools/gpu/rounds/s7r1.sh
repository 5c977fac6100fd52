set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
ts bench-kernels
timeout 120 $g bench-kernels --model 120b --tokens 1 --iters 50 > $out/bk1.txt 2>&1; grep -E "skinny_mma|experts|plain read|combine \| 1x|router" $out/bk1.txt | grep -v "variant\|streamk" | head -40
for m in 0 1 2 3 5 7; do ts "tg 120b prefetch $m"; GPTOSS_L2_PREFETCH=$m timeout 90 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\| random"; done
for m in 0 3; do ts "tg 20b prefetch $m"; GPTOSS_L2_PREFETCH=$m timeout 90 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 1,32 --runs 2 2>&1 | grep -E "^\| random"; done
ts tests
GPTOSS_L2_PREFETCH=7 timeout 200 $K --gtest_filter='Kernels.MoeMxfp4Fragments:Kernels.SkinnyDense:Kernels.RouterRoute*' --gtest_color=no > $out/k.log 2>&1; echo "kernels rc=$?"; grep -E "^\[  FAILED|PASSED" $out/k.log | head
GPTOSS_L2_PREFETCH=7 GPTOSS_TEST_SMALL=1 timeout 150 $bin/test_cuda_model --gtest_filter='-CudaModel.TinyFixtureMatchesCpu' --gtest_color=no > $out/m.log 2>&1; echo "model rc=$?"; grep -E "^\[  FAILED|PASSED" $out/m.log | head
ts sass
(cuobjdump -sass $g | awk '/Function : /{p = ($0 ~ /skinny_mma_kernel/)} p' | xz -6 > $out/sass_skinny.xz) 2>&1 | tail -2; ls -la $out/sass_skinny.xz
ts ncu
KR='regex:skinny_mma_kernel<\(int\)4, \(int\)1, \(int\)8, \(int\)4, \(int\)2'
for m in 0 1; do
GPTOSS_L2_PREFETCH=$m timeout 150 ncu --clock-control none --kernel-name-base demangled -k "$KR" --launch-skip 5 --launch-count 1 --set full -o $out/gu$m $g bench-kernels --model 120b --tokens 1 --iters 20 > $out/ncu_run$m.txt 2>&1; echo "ncu rc=$?"; tail -2 $out/ncu_run$m.txt
ncu -i $out/gu$m.ncu-rep --page details > $out/gu${m}_details.txt 2>&1; grep -E "Duration|DRAM Throughput|Registers Per|Grid Size|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Executed Instructions  " $out/gu${m}_details.txt | head -12
done
ncu -i $out/gu0.ncu-rep --page source --print-source sass --csv > $out/gu0_sass.csv 2>&1; wc -l $out/gu0_sass.csv; xz -6 $out/gu0_sass.csv
ts done
