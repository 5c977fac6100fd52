# Session 45, round 1: issue 10's one-token figures and issue 14's serving on one call.
# - the int8 screen of lm_head, bf16 dense layers: tg128 x1 120b and 20b, screen off / on alternating
#   (s44r2 ran it on an H100; issue 10's targets 550 / 750 are H200 figures);
# - the other dense dtypes at one token (fp8, --mxfp4-layers all; the screen serves bf16 only);
# - tg128 at 8, 32 and 64 sequences (bf16, default);
# - bench-kernels' lm_head greedy rows at 1 and 8 tokens;
# - serving 120b at 32 streams plain and with the device sampler's mixes (s42r2), 64 streams plain.
source tools/gpu/rounds/prelude.sh
ts "does the screen engage (its line at load)"
timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 8 --batch 1 --runs 1 2>&1 | grep -E "screen lm_head|^\| random|rror" >> $S
for screen in 0 1 0 1; do GPTOSS_LM_HEAD_SCREEN=$screen b "screen=$screen" $g 120b 128 1; done
for screen in 0 1 0 1; do GPTOSS_LM_HEAD_SCREEN=$screen b "screen=$screen" $g 20b 128 1; done
for m in 120b 20b; do
  left 200 && b "fp8" $g $m 128 1 --dense-dtype fp8
  left 210 && b "mxfp4 dense" $g $m 128 1 --mxfp4-layers all
done
for x in 8 32 64; do left 240 && RUNS=1 b "default" $g 120b 128 $x; done
for tok in 1 8; do
  left 260 && { timeout 60 $g bench-kernels --model 120b --tokens $tok --iters 50 > $out/bk$tok.txt 2>&1
  grep -E "lm_head greedy|lm_head screen at|\| lm_head \|.*\| skinny_mma bf16 \|" $out/bk$tok.txt >> $S; }
done
left 300 && {
  ts "serve 120b"
  serve_up 120b
  mixed "plain c32"
  left 420 && mixed "1 in 8 with presence_penalty, c32" --extra-body '{"presence_penalty": 0.5}' --extra-body-every 8
  left 450 && mixed "1 in 8 with 5 top logprobs, c32" --extra-body '{"logprobs": 5}' --extra-body-every 8
  left 480 && { ts "64 streams"; bench_c 64; }
  serve_down
}
ts done
