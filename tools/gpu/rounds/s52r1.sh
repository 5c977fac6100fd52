# Session 52, round 1 (an H200; ~9 minutes): what holds the expert walk at ~80% of the H200's
# DRAM rate where a plain read of its own pattern, 8 chunks asked for at once, reaches ~90%
# (fifty-first session: walk 250.8 us against 229.3 at 64 tokens, 181.8 against 166.1 at 32)?
# Diagnostic copies of gptoss (tools/gpu/diag_binary.sh, skinny_units.cu compiled again; the
# values are main's except no_act's, so whole steps of the others mean something):
#   lg4 / lg8   the walk's ring refilled 4 / 8 slots at once after the 4th / 8th is used, so a warp
#               asks for 2 / 4 KB of adjacent chunks together, as the plain read does (the H100 saw
#               no change in the forty-ninth session, but there the walk was within 4% of that read)
#   walk_no_act no shared-memory reads of the activations (garbage sums: bench-kernels rows only)
#   pf256       codes and scales with `.L2::256B`; ef the codes under an L2 evict-first policy
#               (no change on the H100, fifty-first session)
# (1) bench-kernels' walk rows at 64 and 32 tokens, each binary. (2) The steps x32 / x64: main and
# the two exact variants whose gate_up + down + combine at 64 tokens beat main's most, alternating,
# twice. (3) If the best beats main by 2% or more there, 120b serving at 32 and 64 streams with each.
# Pack: EXTRA_BINS="build/diag/gptoss_lg4 build/diag/gptoss_lg8 build/diag/gptoss_walk_no_act
# build/diag/gptoss_pf256 build/diag/gptoss_ef"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
for tk in 64 32; do
  for v in main lg4 lg8 walk_no_act pf256 ef; do
    left 280 && bk_walk $v $(binof $v) $tk 0
  done
done
ts "bench-kernels done"
mainus=$(moe64 main)
rank=$(for v in lg4 lg8 pf256 ef; do us=$(moe64 $v); [ -n "$us" ] && echo "$us $v"; done | sort -n | head -2 | awk '{print $2}')
echo "main $mainus us at 64 tokens; best exact variants: $(echo $rank)" >> $S
for i in 1 2; do for v in main $rank; do
  left 430 && RUNS=1 b "$v" $(binof $v) 120b 128 32,64
done; done
ts "steps done"
best=$(echo $rank | awk '{print $1}'); bestus=$(moe64 $best)
if [ -n "$best" ] && [ -n "$mainus" ] && awk -v a=$bestus -v b=$mainus 'BEGIN{exit !(a < 0.98 * b)}'; then
  serve_each 520 main $best
fi
ts done
