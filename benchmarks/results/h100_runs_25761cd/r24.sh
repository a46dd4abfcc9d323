# issue 9, session 32: the rest of r22c's GPU tests (test_recent_exact.py, test_cache.py) at the head
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%T
set -o pipefail
timeout 360 python -m pytest -q -p no:cacheprovider tests/test_recent_exact.py tests/test_cache.py \
  --durations=5 2>&1 | tee $OUT/tests_recent_cache.txt | tail -n 15
date -u +%T
