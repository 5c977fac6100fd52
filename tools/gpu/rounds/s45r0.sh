# Session 45: the first call of a machine start picks its round by the card: issue 10's figures
# (s45r1) where it is an H200, the serving checks and tests (s45r4) where it is not.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash tools/gpu/rounds/s45r1.sh
else bash tools/gpu/rounds/s45r4.sh; fi
