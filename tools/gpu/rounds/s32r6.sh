# Session 32, call 6: the one-token attention's stage clocks split by split (which block of a
# cluster the others wait for), 120b fp8 at contexts 512 and 2048.
# Pack: EXTRA_BINS="build/diag/gptoss_attn_clocks" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
d=$bin/gptoss_attn_clocks
for p in 512 2048; do
  echo "== clocks 120b x1 fp8 prompt $p" >> $S
  timeout 100 $d bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1 --runs 1 --tg-prompt $p \
    --dense-dtype fp8 2>&1 | grep -E "^\| random|attention clocks" | sed -E 's/mean cycles a block://' >> $S
done
