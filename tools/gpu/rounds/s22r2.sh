# Session 22, second round: the wide dense kernel, second version (the K splits of a row-tile
# group meet in a thread-block cluster through distributed shared memory instead of an L2
# workspace and the group's last block): its tests and sanitizers, bench-kernels, the step with it
# off / on, the dense layers' share of the step (GPTOSS_CUDA_SKIP=dense, output garbage), serving.
# Not on main: the kernel stayed on this session's local branch s22-dense-wide.
source tools/gpu/rounds/prelude.sh
t kwide 150 $K --gtest_filter='Kernels.SkinnyWideDense:Kernels.SkinnyDense'
GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.SkinnyWideDense' > $out/san.txt 2>&1
echo "memcheck rc=$? $(tail -1 $out/san.txt)" >> $S
GPTOSS_TEST_SMALL=1 timeout 45 compute-sanitizer --tool racecheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.SkinnyWideDense' > $out/race.txt 2>&1
echo "racecheck rc=$? $(tail -1 $out/race.txt)" >> $S
for T in 32 64; do
  ts bench-kernels 120b $T
  timeout 100 $g bench-kernels --model 120b --tokens $T --iters 50 2>&1 | grep -E "^\| (qkv|o_proj)" | grep -E "skinny|cublas" >> $S
done
for m in 20b 120b; do
  for w in 0 1; do
    ts step $m dense_wide $w
    GPTOSS_DENSE_WIDE=$w timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 24,32,48,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
ts step 20b skip dense
GPTOSS_CUDA_SKIP=dense timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 32 --batch 32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
for w in 1 0; do ts serve 20b dense_wide $w; GPTOSS_DENSE_WIDE=$w serve_cs 20b -- 64; done
ts done
rm -f $out/*.log $out/san.txt $out/race.txt
cat $S
