# Session 26, round 2: (1) the decode router loads every row's slice at once (cp.async) instead of
# a row a warp at a time: its tests, bench-kernels' router rows and the step at 32 and 64 tokens
# against main's binary (gptoss_head, 691e827); (2) which part of the scales' cost (s26r1: the
# unit kernels 6-10% faster with no scale loads and no scale math) is the load and which the
# math: gptoss_NO_LOAD (the scale math on a value from the code word, no scale load)
# (gptoss_NO_MATH, the load kept and scales 1.0, did not fit the carry), timing only (garbage outputs).
# Build: tools/gpu/diag_binary.sh NO_LOAD src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_SCALE_NO_LOAD
# gptoss: main with the router change (dropped, not on main); gptoss_head: main's binary, copied aside.
# Pack: PACK_TESTS="test_cuda_kernels" EXTRA_BINS="/tmp/gptoss_head build/diag/gptoss_NO_LOAD" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts router tests
t router 200 $K --gtest_filter='Kernels.Router*:Kernels.MoeRoute*'
# (test_cuda_model: not packed this round, the carry limit)
# t model 200 $bin/test_cuda_model
ts bench-kernels
for mt in 120b:1 120b:8 120b:32 120b:64 20b:64; do
  m=${mt%:*}; tok=${mt#*:}
  for b in gptoss gptoss_head gptoss_NO_LOAD; do
    case $b in gptoss|gptoss_head) [ $tok = 1 ] && continue ;; esac
    timeout 60 $bin/$b bench-kernels --model $m --tokens $tok --iters 100 > $out/bk_${m}_${tok}_$b.md 2>&1
    echo "== $m tokens $tok $b" >> $S
    grep -E "fused, variant auto|units ks8 rt4 pf1|units ks8 rt2 pf2|warp units rt1 pf8 16w \|" $out/bk_${m}_${tok}_$b.md | head -12 >> $S
  done
done
ts step
for b in gptoss_head gptoss gptoss_head gptoss; do
  echo "== step 120b $b" >> $S
  timeout 100 $bin/$b bench --device cuda --random-weights 120b --pp '' --tg 32 --batch 32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
for b in gptoss_NO_LOAD; do
  echo "== step 120b $b" >> $S
  timeout 100 $bin/$b bench --device cuda --random-weights 120b --pp '' --tg 32 --batch 1,8,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
echo "== step 120b gptoss_head x1 x8" >> $S
timeout 100 $bin/gptoss_head bench --device cuda --random-weights 120b --pp '' --tg 32 --batch 1,8 --runs 1 2>&1 | grep -E "^\| random" >> $S
ts done
cat $S
