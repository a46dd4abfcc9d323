# issue 9, session 37: main with turbo5v3's key fit at head dim 256 (cherry-picked 8794375) on a GPU: its kernel tests, then its kernel alone against turbo4 at Gemma's shape and the issue's
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
set -o pipefail
timeout 300 python -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels.py -k "head_dims or verify_steps or staging or calls_in_a_row" 2>&1 | tail -n 30 | tee $OUT/tests_kernels.txt
date -u +%T
T=$OUT/kernel_times.txt; : > $T
for x in "--heads 4 1 256" ""; do
  echo "== $x $(date -u +%T)" >> $T
  PYTHONPATH=. timeout 100 python benchmarks/kernel_times.py --contexts 131072 $x --caches turbo4 turbo5v3 >> $T 2>&1 || echo "rc $?" >> $T
done
grep "==\|turbo_decode\|rc " $T; date -u +%T
for v in . devrun/variants/head; do
  n=$([ $v = . ] && echo main || echo before); echo "== stack $n $(date -u +%T)"
  PYTHONPATH=$v timeout 110 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --q-heads 4 --kv-heads 1 --head-dim 256 \
    --contexts 4096 32768 131072 --schemes turbo4 turbo5v3 --out $OUT/stack_d256_$n.md > $OUT/stack_d256_$n.txt 2>&1; echo rc $?
  grep "^| " $OUT/stack_d256_$n.txt | cut -d'|' -f2-6,11-12
done; date -u +%T
