# Session 44, round 2: what the int8 screen of lm_head gives a whole greedy step (issue 10's bf16
# targets: 120b tg128 >= 550, 20b >= 750; last 520.9 and ~733): s43r2 and s43r3 in one call.
# `gptoss bench` tg128, bf16 dense layers, screen off (GPTOSS_LM_HEAD_SCREEN=0) and on alternating
# at one sequence; 20b the same; x8 once each while time is left.
source tools/gpu/rounds/prelude.sh
ts "does the screen engage (its line at load)"
timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 8 --batch 1 --runs 1 2>&1 | grep -E "screen lm_head|^\| random|rror" >> $S
for screen in 0 1 0 1; do left 400 && GPTOSS_LM_HEAD_SCREEN=$screen b "screen=$screen" $g 120b 128 1; done
for screen in 0 1 0 1; do left 480 && GPTOSS_LM_HEAD_SCREEN=$screen b "screen=$screen" $g 20b 128 1; done
for screen in 0 1; do left 480 && GPTOSS_LM_HEAD_SCREEN=$screen RUNS=1 b "screen=$screen" $g 120b 128 8; done
ts done
