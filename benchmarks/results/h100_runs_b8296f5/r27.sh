# issue 9, session 35: HEAD (b8296f5) measured: kernel alone at 128K, GPU kernel tests, the 8-layer stack of five schemes, base (dba72d3) turbo4 beside it
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
T=$OUT/kernel_times.txt; : > $T
kt() {  # variant caches...
  v=$1; shift
  echo "== $v $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 120 python benchmarks/kernel_times.py --caches "$@" --contexts 131072 >> $T 2>&1 || echo "rc $?" >> $T
}
kt head fp16 turbo4 turbo4v2 turbo5v3
kt base turbo4
echo "== end $(date -u +%T)" >> $T
grep "==\|turbo_decode\|cudnn_generated\|rc " $T
date -u +%T
PYTHONPATH=devrun/variants/head timeout 220 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/stack_head.md > $OUT/stack_head.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_head.txt | cut -d'|' -f2-6,11-12; date -u +%T
PYTHONPATH=devrun/variants/base timeout 100 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 --out $OUT/stack_base.md > $OUT/stack_base.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_base.txt | cut -d'|' -f2-6,11-12; date -u +%T
set -o pipefail
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "every_width or staging or batch_rows or long_context or (head_dims and float16)" 2>&1 | tee $OUT/tests_kernels.txt | tail -n 4
date -u +%T
