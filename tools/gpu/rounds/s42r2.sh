# Session 42, round 2: serving 120b at 32 streams with one request in 8 asking for what used to
# bring its rows to the host: presence_penalty, 5 top logprobs, a json_object response_format
# (the whole completion constrained: every one of its rows masked), now drawn on the device; then
# the same with GPTOSS_SAMPLER_HOST_ROWS=1 (those rows kept for the host, as in s41r2:
# 1728 tok/s penalized against 2200 plain). Run s42r1 first (its tests).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" EXTRA_BINS=build/tests/engine/bench_engine_host tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for host in 0 1; do
  ts "serve 120b, GPTOSS_SAMPLER_HOST_ROWS=$host"
  GPTOSS_SAMPLER_HOST_ROWS=$host serve_up 120b
  [ $host = 0 ] && mixed "plain c32"
  mixed "1 in 8 with presence_penalty, c32" --extra-body '{"presence_penalty": 0.5}' --extra-body-every 8
  mixed "1 in 8 with 5 top logprobs, c32" --extra-body '{"logprobs": 5}' --extra-body-every 8
  mixed "1 in 8 with a json_object response_format, c32" --extra-body '{"response_format": {"type": "json_object"}}' --extra-body-every 8
  [ $host = 0 ] && mixed "every request a json_object response_format, c32" --extra-body '{"response_format": {"type": "json_object"}}'
  for rf in '' '{"response_format": {"type": "json_object"}}'; do  # chat: the built-in questions
    ts "chat, 64 requests at 32 streams, 256 tokens out${rf:+, every request $rf}"
    timeout 120 $g bench-serve --base-url http://127.0.0.1:18000 --requests 64 --concurrency 32 --output-len 256 \
      --ignore-eos ${rf:+--extra-body "$rf"} 2>&1 | grep -E "^TTFT|^TPOT|^aggregate|first error" >> $S
  done
  serve_down
done
ts done
