# Session 15, round 6: grouped decode launches with 16-token passes (skinny_mma NT=2) instead of
# the unit-walking kernel's 8-token passes, where groups average ~8 tokens (20b at 64).
# Binaries with a since-removed GPTOSS_SKINNY_PASS_TOKENS (skinny_linear: max_tokens raised to it).
source tools/gpu/rounds/prelude.sh
for mt in "20b 64" "20b 32" "120b 64"; do
  set -- $mt
  for pt in 0 16; do
    GPTOSS_SKINNY_PASS_TOKENS=$pt timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 50 > $out/bk.txt 2>&1
    grep -E "fragments" $out/bk.txt | sed "s/^/pt$pt $1 $2 /" >> $S
  done
done
for pt in 0 16 0 16; do
  GPTOSS_SKINNY_PASS_TOKENS=$pt timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 32,64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/pt$pt /" >> $S
done
rm -f $out/bk.txt
ts done
