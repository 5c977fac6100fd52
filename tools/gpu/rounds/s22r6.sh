# Session 22, sixth round: serving on the final defaults, where `serve` now takes the backend's
# token budget when --max-num-batched-tokens is not given (8192 on an H200, as vLLM's API server
# on GPUs of 70 GiB or more): 20b and 120b at 32 and 64 streams, and the start-up line.
source tools/gpu/rounds/prelude.sh
for m in 20b 120b; do
  ts serve $m default budget
  serve_up $m; grep -o "max_num_seqs.*" $out/serve.log >> $S
  for c in 32 64; do ts $c; bench_c $c; done
  serve_down
done
ts done
rm -f $out/*.log
cat $S
