# Session 41, round 3: sample_token without a copy of the row (logit_bias and penalties made in
# place and taken back): the host time of a step with penalized rows on this host (s41r2: 4664 us
# a step at 1 in 8 penalized of 32, 211 plain, fake 12 ms passes), and serving 120b at 32 streams
# with one request in 8 penalized (s41r2: 1728 tok/s; plain 2200).
# Pack: EXTRA_BINS=build/tests/engine/bench_engine_host tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts "the engine's host time a step (fake 12 ms passes, 32 clients; plain, then 1 in 8 penalized)"
for pe in 0 8; do timeout 60 $bin/bench_engine_host 32 12000 128 1 $pe >> $S 2>&1; done
ts "serve 120b"
serve_up 120b
mixed "1 in 8 with presence_penalty, c32" --extra-body '{"presence_penalty": 0.5}' --extra-body-every 8
mixed "plain c32"
serve_down
ts done
