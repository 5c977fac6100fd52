set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $S
ts attn
for T in 1 32 64; do timeout 60 $g bench-kernels --model 120b --tokens $T --attention-only --iters 30 > $out/attn$T.txt 2>&1; grep -E "\| attention \|" $out/attn$T.txt | grep -E "plan|3 launches|launches" >> $S; done
ts ncu-wgmma
timeout 240 ncu --clock-control none --kernel-name-base demangled -k "regex:expert_gemm_wgmma_kernel" --launch-skip 0 --launch-count 2 --set full --import-source yes -o $out/eg $g bench-kernels --model 120b --tokens 2048 --iters 2 > $out/ncu_run.txt 2>&1; echo "ncu rc=$?" >> $S; tail -2 $out/ncu_run.txt >> $S
ncu -i $out/eg.ncu-rep --page details > $out/eg_details.txt 2>&1; grep -E "Duration|DRAM Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Executed Instructions  |Function Name|Demangled|Tensor|Compute \(SM\) Thr|Memory Thr" $out/eg_details.txt | head -40 >> $S
ncu -i $out/eg.ncu-rep --page raw --csv --metrics smsp__pcsamp_warps_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_barrier > /dev/null 2>&1
ncu -i $out/eg.ncu-rep --page source --print-source sass --csv > $out/eg_sass.csv 2>&1; wc -l $out/eg_sass.csv >> $S; xz -6 $out/eg_sass.csv
xz -6 $out/eg_details.txt
rm -f $out/eg.ncu-rep
ts done
cat $S
