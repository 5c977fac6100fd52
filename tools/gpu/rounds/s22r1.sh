# Session 22, first round: the wide dense kernel (kernels/linear/skinny_wide.cu: qkv and o_proj at
# 17-64 tokens in one pass over their decode copies, instead of cuBLASLt), then the step with it
# off / on. Part "check" (second call): the cuda tests on the same binaries (HEAD's 16-token
# selection and launcher review had not run on a GPU).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" bash .gpu-carry-pack/pack.sh
# Not on main: the kernel stayed on this session's local branch s22-dense-wide (this round ran
# its first version, whose K slices met in an L2 workspace and the group's last block).
source tools/gpu/rounds/prelude.sh
part=${1:-wide}
if [ $part = wide ]; then
  t kwide 150 $K --gtest_filter='Kernels.SkinnyWideDense:Kernels.SkinnyDense'
  GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.SkinnyWideDense' > $out/san.txt 2>&1
  echo "memcheck rc=$? $(tail -1 $out/san.txt)" >> $S
  GPTOSS_TEST_SMALL=1 timeout 45 compute-sanitizer --tool racecheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.SkinnyWideDense' > $out/race.txt 2>&1
  echo "racecheck rc=$? $(tail -1 $out/race.txt)" >> $S
  for T in 32 64; do
    ts bench-kernels 120b $T
    timeout 100 $g bench-kernels --model 120b --tokens $T --iters 50 2>&1 | grep -E "^\| (qkv|o_proj)" >> $S
  done
  for m in 120b 20b; do
    for w in 0 1; do
      ts step $m dense_wide $w
      GPTOSS_DENSE_WIDE=$w timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 24,32,48,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
    done
  done
  for w in 0 1; do
    ts step 120b fp8 dense_wide $w
    GPTOSS_DENSE_WIDE=$w timeout 90 $g bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 --batch 32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
elif [ $part = check ]; then
  t kernels 420 $K --gtest_filter='-Kernels.Attention*:Kernels.Flash*'
  t model 240 $bin/test_cuda_model
  t spec 120 $bin/test_cuda_spec
else
  for w in 0 1; do ts serve 20b dense_wide $w; GPTOSS_DENSE_WIDE=$w serve_cs 20b -- 64 32; done
  ts serve 120b; serve_cs 120b -- 32 64
  GPTOSS_DENSE_WIDE=0 serve_cs 120b -- 32
fi
ts done
rm -f $out/*.log $out/san.txt $out/race.txt
cat $S
