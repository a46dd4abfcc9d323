# issue 9, session 35: main with the lane pairs (c333e06) on an H200, if one came: kernel alone at 128K, the stack of five schemes, GPU kernel tests
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
PYTHONPATH=. timeout 100 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/stack.md > $OUT/stack.txt 2>&1; echo rc $?
grep "^| " $OUT/stack.txt | cut -d'|' -f2-6,11-12; date -u +%T
PYTHONPATH=. timeout 110 python benchmarks/kernel_times.py --caches fp16 turbo4 turbo4v2 turbo5v3 --contexts 131072 > $OUT/kernel_times.txt 2>&1; echo rc $?
grep "turbo_decode\|cudnn_generated" $OUT/kernel_times.txt; date -u +%T
set -o pipefail
timeout 160 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "every_width or staging or batch_rows or long_context or (head_dims and float16)" 2>&1 | tail -n 3 | tee $OUT/tests_kernels.txt
date -u +%T
