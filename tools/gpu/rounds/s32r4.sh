# Session 32, call 4: where the one-token decode attention spends its cycles, stage by stage
# (diagnostic binary gptoss_attn_clocks: -DGPTOSS_DIAG_ATTN_CLOCKS, clock64 at each stage of every
# block, mean cycles printed at exit), 120b fp8 and bf16 at one token and 32 sequences.
# Pack: EXTRA_BINS="build/diag/gptoss_attn_clocks" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
d=$bin/gptoss_attn_clocks
ts start
for f in "--dense-dtype fp8" ""; do
  echo "== clocks 120b x1 $f" >> $S
  timeout 100 $d bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1 --runs 1 $f 2>&1 | grep -E "^\| random|attention clocks" >> $S
done
echo "== clocks 120b x32 fp8" >> $S
timeout 100 $d bench --device cuda --random-weights 120b --pp '' --tg 16 --batch 32 --runs 1 --dense-dtype fp8 2>&1 | grep -E "^\| random|attention clocks" >> $S
echo "== clocks 120b x1 fp8, tg-prompt 4096" >> $S
timeout 100 $d bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1 --runs 1 --tg-prompt 4096 --dense-dtype fp8 2>&1 | grep -E "^\| random|attention clocks" >> $S
ts done
