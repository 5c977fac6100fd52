# Session 53 (prepared in session 52): on an H200, issue 10's and 14's target figures at HEAD in
# one call (none since the forty-eighth session's; sessions 49-52 got only H100s): tg128 x1 for
# 120b and 20b with bf16, fp8 and MXFP4 dense layers; x8 / x32 / x64 (120b, bf16); bench-kernels'
# MoE rows at 1, 8, 32 and 64 tokens (120b); serving 120b and 20b at 32 and 64 streams. On an
# H100 it only reports the card (seconds, not minutes): the H100 has nothing queued.
# Then, on an H200 still, s52r1.sh (the walk's diagnostic variants: its own pack line).
# Pack: tools/gpu/pack.sh (gptoss alone).
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { ts "not an H200: nothing to run"; exit 0; }
for m in 120b 20b; do
  left 120 && b "bf16" $g $m 128 1
  left 150 && b "fp8" $g $m 128 1 --dense-dtype fp8
  left 180 && b "mxfp4 dense" $g $m 128 1 --mxfp4-layers all
done
for x in 8 32 64; do left 230 && RUNS=1 b "default" $g 120b 128 $x; done
for tok in 1 8 32 64; do
  left 280 && { timeout 60 $g bench-kernels --model 120b --tokens $tok --iters 20 > $out/bk$tok.txt 2>&1
  echo "== bench-kernels 120b $tok tokens" >> $S; grep -E "experts gate_up \+ down" $out/bk$tok.txt | head -4 >> $S; }
done
for m in 120b 20b; do left 420 && { ts "serve $m"; serve_up $m; bench_c 32; left 520 && bench_c 64; serve_down; }; done
ts done
