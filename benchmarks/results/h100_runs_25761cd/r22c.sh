# issue 9, session 32: GPU tests at the head (25761cd + results): the codec's per-byte tables (5792f57)
# and the one-pass portable decode (f0ba4e9) were never run on a GPU; the kernels' main cases again
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%T
set -o pipefail
timeout 290 python -m pytest -q -p no:cacheprovider tests/test_packing.py tests/test_codebooks.py \
  tests/test_attention.py tests/test_recent_exact.py tests/test_cache.py 2>&1 | tee $OUT/tests_portable.txt | tail -n 15
date -u +%T
timeout 250 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "every_width or staging or batch_rows or long_context" 2>&1 | tee $OUT/tests_kernels.txt | tail -n 15
date -u +%T
