# Session 44, round 5 (prepared for the last device minutes, ~200 s; not run): the kernel rows, Nsight Compute and step sweep of the lm_head
# screen, then s42r2's serving checks of the device sampler (one request in 8 with a penalty, top
# logprobs or a json_object format; every request a json_object format; chat) on the device path
# only, while time is left.
source tools/gpu/rounds/prelude.sh
for tok in 1 8; do
  timeout 60 $g bench-kernels --model 120b --tokens $tok --iters 50 > $out/bk$tok.txt 2>&1
  grep -E "lm_head greedy|lm_head screen at|\| lm_head \|.*\| skinny_mma bf16 \|" $out/bk$tok.txt >> $S
done
for pf in 1 3 2; do GPTOSS_LM_HEAD_SCREEN_PF=$pf b "screen pf=$pf" $g 120b 128 1; done
ts "serve 120b (device sampler)"
serve_up 120b
mixed "plain c32"
mixed "1 in 8 with presence_penalty, c32" --extra-body '{"presence_penalty": 0.5}' --extra-body-every 8
mixed "1 in 8 with 5 top logprobs, c32" --extra-body '{"logprobs": 5}' --extra-body-every 8
left 150 && mixed "1 in 8 with a json_object response_format, c32" --extra-body '{"response_format": {"type": "json_object"}}' --extra-body-every 8
left 165 && mixed "every request a json_object response_format, c32" --extra-body '{"response_format": {"type": "json_object"}}'
left 175 && { ts "chat, 64 requests at 32 streams"; timeout 60 $g bench-serve --base-url http://127.0.0.1:18000 --requests 64 \
  --concurrency 32 --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^TPOT|^aggregate|first error" >> $S; }
serve_down
left 185 && bash tools/gpu/rounds/s43r5.sh
ts done
