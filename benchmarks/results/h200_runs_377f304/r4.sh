# session 25, round 4: the simd file's tests fixed for MLX-CUDA's deferred decode token
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u
timeout 140 python -m pytest -q -p no:cacheprovider -rfE tests/test_kernel_simd.py -k "emulated or run_time_check_passes or recent_tokens_read_exactly_in_the_tail" > $OUT/g.txt 2>&1
tail -n 3 $OUT/g.txt; grep -m 5 "^FAILED" $OUT/g.txt; date -u
