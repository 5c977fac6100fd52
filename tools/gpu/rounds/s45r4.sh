# Session 45, round 4 (what s45r0 runs on an H100, where s44r2 already measured the screen): the
# device sampler under serving (s42r2's mixes: one request in 8 with presence_penalty or 5 top
# logprobs, never run on a GPU with a server), the prefill passes' sizes at 32 and 64 streams (the
# timeline's new listing), then the kernel tests but attention's while time is left.
source tools/gpu/rounds/prelude.sh
ts "serve 120b"
serve_up 120b
mixed "plain c32"
mixed "1 in 8 with presence_penalty, c32" --extra-body '{"presence_penalty": 0.5}' --extra-body-every 8
mixed "1 in 8 with 5 top logprobs, c32" --extra-body '{"logprobs": 5}' --extra-body-every 8
ts "64 streams"; bench_c 64
serve_down
left 200 && t kernels 380 $K --gtest_filter='-Kernels.Attention*:Kernels.Flash*:Kernels.*WarpSpecialized*'
ts done
