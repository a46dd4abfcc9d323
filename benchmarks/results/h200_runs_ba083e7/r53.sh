# issue 9, session 41: the exact items' cases of test_kernels.py on the GPU at the working tree (exact items spread over the warps, pair tables filled by shuffles); the 8-layer stack, turbo4 and turbo2, one step at a time and pipelined; each kernel alone at 128K
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
timeout 200 python -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels.py -k "sinks or recent or window or raw" 2>&1 | tail -n 8 | tee $OUT/tests_kernels_exact.txt; date -u +%T
PYTHONPATH=. timeout 150 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo2 --out $OUT/stack.md > $OUT/stack.txt 2>&1; echo rc $?
grep "^| " $OUT/stack.txt | cut -d'|' -f2-6,11-12; date -u +%T
PYTHONPATH=. timeout 120 python benchmarks/kernel_times.py --caches fp16 turbo4 turbo4v2 turbo3 turbo2 --contexts 131072 > $OUT/kernel_times.txt 2>&1; echo rc $?
grep "turbo_decode\|cudnn_generated" $OUT/kernel_times.txt; date -u +%T
