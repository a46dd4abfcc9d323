# issue 9, session 35: head (b8296f5) against nib (4-bit keys and values' levels by byte permutes in registers, no shuffles): kernel alone at 128K; nib's GPU tests, stack; test_cache's last 12 on the GPU
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
mkdir -p devrun/variants/nib && cp -r mlx_lm_turbo devrun/variants/nib/
T=$OUT/kernel_times.txt; : > $T
kt() {  # variant caches...
  v=$1; shift
  echo "== $v $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 120 python benchmarks/kernel_times.py --caches "$@" --contexts 131072 >> $T 2>&1 || echo "rc $?" >> $T
}
kt head turbo4 turbo4v2
kt nib fp16 turbo4 turbo4v2
kt head turbo4
echo "== end $(date -u +%T)" >> $T
grep "==\|turbo_decode\|cudnn_generated\|rc " $T
set -o pipefail
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "every_width or staging or batch_rows or long_context or (head_dims and float16)" 2>&1 | tee $OUT/tests_kernels.txt | tail -n 4
date -u +%T
PYTHONPATH=devrun/variants/nib timeout 100 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/stack_nib.md > $OUT/stack_nib.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_nib.txt | cut -d'|' -f2-6,11-12; date -u +%T
PYTHONPATH=devrun/variants/head timeout 60 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 --out $OUT/stack_head.md > $OUT/stack_head.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_head.txt | cut -d'|' -f2-6,11-12; date -u +%T
timeout 120 python -m pytest -q -p no:cacheprovider $(cat devrun/cache_tail_tests.txt) 2>&1 | tee $OUT/tests_cache_tail.txt | tail -n 4
date -u +%T
