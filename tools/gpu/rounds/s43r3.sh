# Session 43, round 3: s43r2 for 20b (bf16 dense layers, screen off / on, x1 and x8).
MODELS=20b source tools/gpu/rounds/s43r2.sh
