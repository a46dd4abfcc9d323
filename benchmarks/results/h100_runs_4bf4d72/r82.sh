# issue 9, session 46 (main 4bf4d72): the whole of tests/test_kernels.py on the device (test_two_bit_values_at_head_dim_64 included)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
timeout 560 python -m pytest -q --tb=short -p no:cacheprovider --durations=10 tests/test_kernels.py > $OUT/test_kernels.txt 2>&1; echo "tests rc $?"
tail -n 30 $OUT/test_kernels.txt; date -u +%T
