# Session 48 (prepared in session 47): on an H200, issue 10's H200 figures (s45r1: the lm_head
# screen's A/B at one token, fp8 and MXFP4 dense, 8-64 sequences, serving). On an H100 there is
# nothing prepared: sessions 46-47 measured every variant queued (docs/BENCHMARKS.md), so the
# call only reports the card and returns, spending seconds, not minutes.
# Pack: tools/gpu/pack.sh (gptoss alone: s45r1 runs bench, bench-kernels, serve and bench-serve).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash tools/gpu/rounds/s45r1.sh
else nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $OUT/summary.txt; fi
