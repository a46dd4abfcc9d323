# issue 9, session 36: main (head) against p3 (3-bit values' A registers from a 64-pair table held 16 times side by side, 4 KiB aligned): kernel alone at 128K side by side, p3's GPU kernel tests, p3's stack
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
T=$OUT/kernel_times.txt; : > $T
kt() {  # variant extra-args caches...
  v=$1; x=$2; shift 2
  echo "== $v $x $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 120 python benchmarks/kernel_times.py $x --caches "$@" --contexts 131072 >> $T 2>&1 || echo "rc $?" >> $T
}
kt head "" turbo4 turbo3 turbo5v3
kt p3 "" turbo4 turbo3 turbo5v3 turbo4v3
kt head "--stage-buffers 1" turbo5v3
kt head "" turbo3
echo "== end $(date -u +%T)" >> $T
grep "==\|turbo_decode\|cudnn_generated\|rc " $T
set -o pipefail
PYTHONPATH=devrun/variants/p3 timeout 200 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "every_width or staging or batch_rows or long_context or (head_dims and float16) or verify_steps or more_than_eight" 2>&1 | tail -n 4 | tee $OUT/tests_kernels_p3.txt
date -u +%T
PYTHONPATH=devrun/variants/p3 timeout 100 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/stack_p3.md > $OUT/stack_p3.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_p3.txt | cut -d'|' -f2-6,11-12; date -u +%T
