# session 27, round 3: the GPU tests of the kernels and the recent window with the rows
# ordered by one kernel reading the buffer and the last launch's output; diag_rows.py again
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
T="timeout 330 python -m pytest -q -p no:cacheprovider -rfE"
for i in 0 1 2 3; do (MLX_PTX_CACHE_DIR=/tmp/pk$i $T $(cat devrun/k_part_0$i) > $OUT/k_$i.txt 2>&1) & done
for i in 0 1; do (MLX_PTX_CACHE_DIR=/tmp/pr$i $T $(cat devrun/r_part_0$i) > $OUT/recent_$i.txt 2>&1) & done
(export MLX_PTX_CACHE_DIR=/tmp/ptx_diag; for a in "turbo4 128 32 6" "turbo4 128 16 6" "turbo2 256 32 6" "turbo4 128 32 12"; do timeout 100 python devrun/diag_rows.py plain $a 2>&1 | tail -n 1; done > $OUT/diag.txt) &
wait
for f in $OUT/k_?.txt $OUT/recent_?.txt; do echo "$f: $(tail -n 1 $f)"; grep -m 5 "^FAILED\|^ERROR" $f; done
cat $OUT/diag.txt
date -u
