# Session 22, third round (s22r2's binaries, the wide kernel off: GPTOSS_DENSE_WIDE=0, so HEAD's
# code paths): where a 32- and 64-token step goes in the graphs (GPTOSS_CUDA_SKIP=group leaves a
# group of ops out; output garbage; the step time without it is its cost), and serving with
# --max-num-batched-tokens 8192 (issue 14's 64-stream targets against the default 2048).
# (GPTOSS_DENSE_WIDE=0 is a no-op on main, where the wide kernel is not.)
source tools/gpu/rounds/prelude.sh
export GPTOSS_DENSE_WIDE=0
for m in 20b 120b; do
  for sk in none dense attn router experts lm_head; do
    ts step $m skip $sk
    GPTOSS_CUDA_SKIP=$([ $sk = none ] || echo $sk) timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
for m in 20b 120b; do ts serve $m budget 8192; serve_cs $m --max-num-batched-tokens 8192 -- 32 64; done
ts done
rm -f $out/*.log
cat $S
