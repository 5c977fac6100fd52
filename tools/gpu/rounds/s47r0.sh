# Session 47 (prepared in session 46): the first call picks its round by the card: issue 10's
# H200 figures (s45r1: the lm_head screen's A/B at one token, fp8 and MXFP4 dense, 8-64
# sequences, serving) on an H200; on an H100 the pair kernel's second form (s46r4).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash tools/gpu/rounds/s45r1.sh
else bash tools/gpu/rounds/s46r4.sh; fi
