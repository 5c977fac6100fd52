# s14r5 ran out of its 600 s before its servers (check.sh took 555 s); the servers alone, same binaries.
source tools/gpu/rounds/prelude.sh
srv 18100 20b -- 32 64
srv 18101 120b -- 32 64
cat $S
