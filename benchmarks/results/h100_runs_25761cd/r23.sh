# issue 9, session 32: 4-bit keys decoded by byte permutes (no shared-memory table) against HEAD's kernel
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
T=$OUT/kernel_times.txt; : > $T
echo "== permute (working tree) $(date -u +%T)" >> $T
timeout 120 python benchmarks/kernel_times.py --caches fp16 turbo4 turbo4v2 --contexts 131072 >> $T 2>&1 || echo "rc $?" >> $T
echo "== base (HEAD) $(date -u +%T)" >> $T
PYTHONPATH=devrun/variants/base timeout 90 python benchmarks/kernel_times.py --caches turbo4 turbo4v2 --contexts 131072 >> $T 2>&1 || echo "rc $?" >> $T
grep "==\|turbo_decode\|cudnn_generated\|rc " $T
for v in permute base; do
  if [ $v = base ]; then pp=devrun/variants/base; else pp=; fi
  PYTHONPATH=$pp timeout 150 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
    --contexts 4096 32768 131072 --schemes turbo4 turbo4v2 --out $OUT/da_$v.md > $OUT/da_$v.txt 2>&1; echo $v rc $?
  grep "^| " $OUT/da_$v.txt | cut -d'|' -f2-6,11-12; date -u +%T
done
set -o pipefail
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "every_width or staging or batch_rows or long_context or (head_dims and float16)" 2>&1 | tee $OUT/tests_kernels.txt | tail -n 8
date -u +%T
