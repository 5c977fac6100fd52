set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
ts ncu-router
timeout 200 ncu --clock-control none --kernel-name-base demangled -k "regex:router_v2_kernel" --launch-skip 3 --launch-count 1 --set full --import-source yes -o $out/rt $g bench-kernels --model 120b --tokens 32 --iters 5 > $out/ncu_run.txt 2>&1; echo "ncu rc=$?" >> $S; tail -2 $out/ncu_run.txt >> $S
ncu -i $out/rt.ncu-rep --page details > $out/rt_details.txt 2>&1; grep -E "Duration|DRAM Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Executed Instructions  |Function Name|Demangled" $out/rt_details.txt | head -14 >> $S
ncu -i $out/rt.ncu-rep --page source --print-source sass --csv > $out/rt_sass.csv 2>&1; wc -l $out/rt_sass.csv >> $S; xz -6 $out/rt_sass.csv
rm -f $out/rt.ncu-rep
ts done
cat $S
