# Session 44, round 3: the lm_head screen's kernels alone (bench-kernels' "lm_head greedy" rows,
# which s44r1 missed: bench-kernels reached them with stream-K chosen; fixed now),
# Nsight Compute of its three kernels (s43r5), and the step at the screen's chunks in flight 1-3.
source tools/gpu/rounds/prelude.sh
for tok in 1 8; do
  timeout 90 $g bench-kernels --model 120b --tokens $tok --iters 50 > $out/bk$tok.txt 2>&1
  grep -E "lm_head greedy|lm_head screen at|\| lm_head \|.*\| skinny_mma bf16 \|" $out/bk$tok.txt >> $S
done
bash tools/gpu/rounds/s43r5.sh
for pf in 1 3 2; do GPTOSS_LM_HEAD_SCREEN_PF=$pf b "screen pf=$pf" $g 120b 128 1; done
ts done
