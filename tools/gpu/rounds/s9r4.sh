set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
prof() { local tag=$1 regex=$2 skip=$3; shift 3
  timeout 200 ncu --clock-control none --kernel-name-base demangled -k "regex:$regex" --launch-skip $skip --launch-count 1 --set full --import-source yes -o $out/$tag "$@" > $out/${tag}_run.txt 2>&1; echo "ncu $tag rc=$?" >> $S
  ncu -i $out/$tag.ncu-rep --page details > $out/${tag}_d.txt 2>&1; grep -E "Duration|DRAM Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Executed Instructions  |Function Name|Demangled|Theoretical Occ|Block Limit" $out/${tag}_d.txt | head -16 >> $S
  ncu -i $out/$tag.ncu-rep --page source --print-source sass --csv > $out/${tag}_sass.csv 2>&1; xz -6 $out/${tag}_sass.csv; rm -f $out/$tag.ncu-rep $out/${tag}_d.txt $out/${tag}_run.txt; }
ts ncu-attn
prof at "attention_decode_mma_kernel<false, false>" 18 $g bench-kernels --model 120b --tokens 32 --attention-only --iters 5
ts ncu-units
prof su "skinny_units_kernel" 0 $g bench-kernels --model 20b --tokens 32 --iters 3
ts done
cat $S
