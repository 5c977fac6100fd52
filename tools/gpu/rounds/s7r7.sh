set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss
KR='regex:skinny_mma_kernel<\(int\)4, \(int\)1, \(int\)8, \(int\)2, \(int\)4, \(bool\)1, \(int\)45'
timeout 150 ncu --clock-control none --kernel-name-base demangled -k "$KR" --launch-skip 5 --launch-count 1 --set full -o $out/dn $g bench-kernels --model 120b --tokens 1 --iters 20 > $out/ncu_run.txt 2>&1; echo "ncu rc=$?"; tail -2 $out/ncu_run.txt
ncu -i $out/dn.ncu-rep --page details > $out/dn_details.txt 2>&1; grep -E "Duration|DRAM Throughput|Registers Per|Grid Size|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Executed Instructions  |L2 Hit Rate|Spilling Requests  " $out/dn_details.txt | head -14
ncu -i $out/dn.ncu-rep --page source --print-source sass --csv > $out/dn_sass.csv 2>&1; xz -6 $out/dn_sass.csv; rm -f $out/dn.ncu-rep
KR2='regex:skinny_mma_kernel<\(int\)4, \(int\)1, \(int\)8, \(int\)4, \(int\)1, \(bool\)1, \(int\)45'
timeout 150 ncu --clock-control none --kernel-name-base demangled -k "$KR2" --launch-skip 5 --launch-count 1 --set full -o $out/gu $g bench-kernels --model 120b --tokens 1 --iters 20 > $out/ncu_run2.txt 2>&1; echo "ncu rc=$?"
ncu -i $out/gu.ncu-rep --page details > $out/gu_details.txt 2>&1; grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Executed Instructions  |Spilling Requests  " $out/gu_details.txt | head -10
ncu -i $out/gu.ncu-rep --page source --print-source sass --csv > $out/gu_sass.csv 2>&1; xz -6 $out/gu_sass.csv; rm -f $out/gu.ncu-rep
