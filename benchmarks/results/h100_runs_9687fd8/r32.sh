# issue 9, session 37: main (9687fd8) on an H200, if one came: the stack of five schemes, every width's kernel alone at 128K
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
PYTHONPATH=. timeout 130 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/stack.md > $OUT/stack.txt 2>&1; echo rc $?
grep "^| " $OUT/stack.txt | cut -d'|' -f2-6,11-12; date -u +%T
PYTHONPATH=. timeout 130 python benchmarks/kernel_times.py --caches fp16 turbo4 turbo4v2 turbo5v3 turbo3 turbo2 --contexts 131072 > $OUT/kernel_times.txt 2>&1; echo rc $?
grep "turbo_decode\|cudnn_generated" $OUT/kernel_times.txt; date -u +%T
