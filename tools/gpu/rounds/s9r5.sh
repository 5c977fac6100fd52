set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -12 >> $S; }
ts tests
t k 300 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV3:Kernels.ExpertGemmAwkwardGroups:Kernels.ExpertGemmV3TileRows:Kernels.WgmmaDenseTileLayout:Kernels.MoeMxfp4ExpertGemmV2:Kernels.MoeMxfp4Fragments'
grep -E "128-row|m128|worst" $out/k.log | head -8 >> $S
GPTOSS_TEST_SMALL=1 timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.ExpertGemmAwkwardGroups:Kernels.MoeMxfp4ExpertGemmV3' > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY" $out/memcheck.log | head -2 >> $S
ts bench-kernels
for m in 120b 20b; do timeout 120 $g bench-kernels --model $m --tokens 2048 --iters 5 > $out/bk_$m.txt 2>&1; grep -iE "v3|experts gate_up \+ down" $out/bk_$m.txt | head -16 >> $S; done
ts pp
for m in 120b 20b; do for tm in 64 128 auto; do if [ $tm = auto ]; then unset GPTOSS_EXPERT_GEMM_TILE_M; else export GPTOSS_EXPERT_GEMM_TILE_M=$tm; fi; timeout 120 $g bench --device cuda --random-weights $m --pp 2048,8192 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/tm=$tm /" >> $S; done; done
unset GPTOSS_EXPERT_GEMM_TILE_M
ts ncu-attn
timeout 100 ncu --clock-control none --kernel-name-base demangled -k "regex:attention_decode_mma_kernel" --launch-skip 216 --launch-count 1 --set full --import-source yes -o $out/at $g bench-kernels --model 120b --tokens 32 --attention-only --iters 5 > $out/at_run.txt 2>&1; echo "ncu rc=$?" >> $S
ncu -i $out/at.ncu-rep --page details > $out/at_d.txt 2>&1; grep -E "Duration|DRAM Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Executed Instructions  |attention_decode_mma_kernel|Theoretical Occ" $out/at_d.txt | head -14 >> $S
ncu -i $out/at.ncu-rep --page source --print-source sass --csv > $out/at_sass.csv 2>&1; xz -6 $out/at_sass.csv; rm -f $out/at.ncu-rep $out/at_d.txt
ts done
cat $S
