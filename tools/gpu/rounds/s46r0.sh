# Session 46: the first call picks its round by the card: issue 10's H200 figures (s45r1, still
# not taken) on an H200; on an H100 the decode attention's diagnostics at 32-64 sequences (s46r1).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash tools/gpu/rounds/s45r1.sh
else bash tools/gpu/rounds/s46r1.sh; fi
