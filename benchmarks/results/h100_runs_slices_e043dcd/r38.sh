# issue 9, session 37: the kernel alone at Gemma's attention shape (4 query / 1 KV head, head dim 256: one group, so 255 slices whose parts one block merges) against the most slices allowed; cuDNN's fp16 beside it
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
T=$OUT/kernel_times.txt; : > $T
for m in 0 64 16; do
  echo "== max-slices $m $(date -u +%T)" >> $T
  PYTHONPATH=. timeout 100 python benchmarks/kernel_times.py --heads 4 1 256 --contexts 32768 131072 --max-slices $m --caches turbo4 >> $T 2>&1 || echo "rc $?" >> $T
  grep "==\|turbo_decode\|rc " $T | tail -3
done
echo "== fp16 $(date -u +%T)" >> $T
PYTHONPATH=. timeout 60 python benchmarks/kernel_times.py --heads 4 1 256 --contexts 32768 131072 --caches fp16 >> $T 2>&1 || echo "rc $?" >> $T
grep "==\|cudnn\|rc " $T; date -u +%T
