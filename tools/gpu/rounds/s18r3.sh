# Session 18, round 3: s18r2.sh's round on binaries whose engine thread spins through the pass it
# waits for when a GPU computes it (Backend::computes_on_host).
ENGINE_RUNS="0 1 0 1" source tools/gpu/rounds/s18r1.sh
