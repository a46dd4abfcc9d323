# issue 9, session 45: turbo3's staging memory 128-byte aligned and its value words read two a group (the change after b5fdd53): turbo3's and turbo4's launch alone at 128K, then the 3-bit and 2-bit GPU tests
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
timeout 70 python benchmarks/kernel_times.py --caches turbo3 turbo4 --contexts 131072 > $OUT/kernel_times.txt 2>&1; echo "kernel_times rc $?"
grep "turbo_decode" $OUT/kernel_times.txt | cut -c1-130; date -u +%T
timeout 75 python -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels.py -k "(every_width and (turbo3 or turbo2)) or (head_dims_and_dtypes and (turbo3 or turbo2))" > $OUT/tests.txt 2>&1; echo "tests rc $?"
tail -n 5 $OUT/tests.txt; date -u +%T
