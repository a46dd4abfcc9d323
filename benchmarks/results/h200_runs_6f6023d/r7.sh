# session 26, round 3: the decode launch with the slices' parts in a shared workspace and
# a window's row leading its tail (two outputs fewer): the GPU tests of the kernels
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
git log -1 --format='%h %s' | tee -a $OUT/device.txt; git status --short | grep -v "^??" | tee -a $OUT/device.txt; date -u | tee -a $OUT/device.txt
T="timeout 330 python -m pytest -q -p no:cacheprovider -rfE"
for i in 0 1 2 3; do (MLX_PTX_CACHE_DIR=/tmp/pk$i $T $(cat devrun/k_part_0$i) > $OUT/k_$i.txt 2>&1) & done
(MLX_PTX_CACHE_DIR=/tmp/pr $T tests/test_recent_exact.py > $OUT/recent.txt 2>&1) &
(MLX_PTX_CACHE_DIR=/tmp/ps $T tests/test_kernel_simd.py -k "emulated or run_time_check or recent" > $OUT/simd.txt 2>&1) &
wait
for f in $OUT/k_?.txt $OUT/recent.txt $OUT/simd.txt; do echo "$f: $(tail -n 1 $f)"; grep -m 5 "^FAILED\|^ERROR" $f; done
date -u
