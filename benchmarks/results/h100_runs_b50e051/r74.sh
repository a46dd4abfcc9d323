# issue 9, session 45 (main b50e051) after r73.sh: the whole of tests/test_kernels.py on the device
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
timeout 540 python -m pytest -q --tb=short -p no:cacheprovider --durations=15 tests/test_kernels.py > $OUT/test_kernels.txt 2>&1; echo "tests rc $?"
tail -n 40 $OUT/test_kernels.txt; date -u +%T
