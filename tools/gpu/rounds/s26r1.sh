# Session 26, round 1: how much of the one-token expert launches the scale requests cost. A
# diagnostic binary (gptoss_noscale_s: skinny_units.cu built with a one-off hook, not kept: no scale
# load, a constant scale word; GPTOSS_DIAG_SCALE_NO_MATH measures about the same; garbage output) against main's (691e827) at
# 1-64 tokens; the decode step by op at 1, 32 and 64 tokens (GPTOSS_CUDA_PROFILE=1); model tests.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" EXTRA_BINS=/tmp/diag/gptoss_noscale_s bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts model tests
t model 200 $bin/test_cuda_model
ts bench-kernels
for mt in 120b:1 120b:8 120b:64 20b:1 20b:64; do
  m=${mt%:*}; tok=${mt#*:}
  {
    for b in gptoss gptoss_noscale_s; do
      timeout 60 $bin/$b bench-kernels --model $m --tokens $tok --iters 100 > $out/bk_${m}_${tok}_$b.md 2>&1
      echo "== $m tokens $tok $b" >> $S
      grep -E "gate_up|down|combine|router" $out/bk_${m}_${tok}_$b.md | head -40 >> $S
    done
  }
done
ts step
for b in gptoss gptoss_noscale_s; do
  echo "== step $b" >> $S
  timeout 120 $bin/$b bench --device cuda --random-weights 120b --pp '' --tg 32 --batch 1,2,8 --runs 2 2>&1 | grep -E "^\| random" >> $S
done
ts profile
for bt in 1 64; do
  echo "== profile 120b batch $bt" >> $S
  GPTOSS_CUDA_PROFILE=1 timeout 100 $g bench --device cuda --random-weights 120b --pp '' --tg 16 --batch $bt --runs 1 > $out/profile_120b_$bt.log 2>&1
  grep -A30 "cuda profile" $out/profile_120b_$bt.log >> $S
done
ts done
cat $S
