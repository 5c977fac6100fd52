# Session 23, round 3: moe_one_token version 2 (partials stored without a fence inside the stream,
# one fence a warp after it): tests, memcheck, bench-kernels with the debug ablations (1: no down,
# 2: gate_up's stream alone), the batch-1 step off / on, Nsight Compute of the kernel.
# Pack: PACK_TESTS="test_cuda_kernels" bash .gpu-carry-pack/pack.sh
# The kernel is not on main: branch s23-moe-one-token (correct, slower; docs/BENCHMARKS.md, twenty-third session).
source tools/gpu/rounds/prelude.sh
t kone 200 $K --gtest_filter='Kernels.MoeOneTokenFused'
GPTOSS_TEST_SMALL=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.MoeOneTokenFused' > $out/san.txt 2>&1
echo "memcheck rc=$? $(tail -1 $out/san.txt)" >> $S
for m in 120b 20b; do
  for d in 0 1 2; do
    ts bench-kernels $m 1 debug $d
    GPTOSS_ONE_TOKEN_DEBUG=$d timeout 100 $g bench-kernels --model $m --tokens 1 --iters 100 2>&1 | grep -E "^\| experts gate_up \+ down.*(two|one)|plain read" >> $S
  done
done
for m in 120b 20b; do
  for v in 0 1; do
    ts step $m one_token $v
    GPTOSS_MOE_ONE_TOKEN=$v timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
ts ncu
timeout 150 $NCU --clock-control none -k "regex:moe_one_token" --launch-skip 3 --launch-count 1 --set full -o $out/one $g bench-kernels --model 120b --tokens 1 --iters 10 > $out/ncu.log 2>&1; echo "ncu rc=$?" >> $S
$NCU --import $out/one.ncu-rep --page details --csv > $out/one_details.csv 2>&1
grep -E '"(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|No Eligible|Dynamic Shared Memory Per Block|L2 Hit Rate|Warp Cycles Per Issued Instruction|Executed Instructions|Elapsed Cycles)"' $out/one_details.csv | cut -d, -f13-16 >> $S
$NCU --import $out/one.ncu-rep --page source --print-source sass --csv > $out/one_sass.csv 2>&1
rm -f $out/one.ncu-rep
ts done
rm -f $out/*.log $out/san.txt
cat $S
