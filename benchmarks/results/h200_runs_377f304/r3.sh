# session 25, round 3: the rest of the kernel tests with sources #included (round 2's shards
# were cut by their time limit), and the emulated simd checks against the portable path
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
git log -1 --format='%h' | tee $OUT/device.txt; git status --short | grep -v "^??" | tee -a $OUT/device.txt; date -u | tee -a $OUT/device.txt
T="timeout 420 python -m pytest -q -p no:cacheprovider -rfE"
(MLX_PTX_CACHE_DIR=/tmp/pa $T $(cat devrun/k_part_00) > $OUT/a.txt 2>&1) &
(MLX_PTX_CACHE_DIR=/tmp/pb $T $(cat devrun/k_part_01) > $OUT/b.txt 2>&1) &
(MLX_PTX_CACHE_DIR=/tmp/pc $T $(cat devrun/k_part_02) > $OUT/c.txt 2>&1) &
(MLX_PTX_CACHE_DIR=/tmp/pd $T tests/test_recent_exact.py > $OUT/d.txt 2>&1) &
(MLX_PTX_CACHE_DIR=/tmp/pe $T tests/test_kernel_simd.py -k emulated > $OUT/e.txt 2>&1) &
(MLX_PTX_CACHE_DIR=/tmp/pf $T $(cat devrun/s_rest.txt) > $OUT/f.txt 2>&1) &
wait
for f in $OUT/?.txt; do echo "$f: $(tail -n 1 $f)"; grep -m 5 "^FAILED\|^ERROR" $f; done
date -u
