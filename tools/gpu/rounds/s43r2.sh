# Session 43, round 2: what the int8 screen of lm_head gives a whole greedy step (issue 10's bf16
# targets: 120b tg128 >= 550, 20b >= 750; last 520.9 and ~733). `gptoss bench` tg128 at one
# sequence (pipelined greedy steps: launch_greedy, the screened graphs) with the screen off
# (GPTOSS_LM_HEAD_SCREEN=0) and on, alternating, bf16 dense layers; then x8, where the screen
# still serves (1-8 rows), once each. MODELS="120b" (default) or "20b" (round 3: s43r3.sh).
source tools/gpu/rounds/prelude.sh
ts "does the screen engage (its line at load)"
timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 8 --batch 1 --runs 1 2>&1 | grep -E "screen lm_head|^\| random|rror" >> $S
for m in ${MODELS:-120b}; do
  for screen in 0 1 0 1; do GPTOSS_LM_HEAD_SCREEN=$screen b "screen=$screen" $g $m 128 1; done
  for screen in 0 1; do GPTOSS_LM_HEAD_SCREEN=$screen RUNS=1 b "screen=$screen" $g $m 128 8; done
done
ts done
