# issue 9, session 45 after r75.sh: each kernel alone at 128K under ncu, turbo4 with two staging buffers (dynamic) and one (static)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
for b in 2 1; do
  timeout 100 python benchmarks/kernel_times.py --caches fp16 turbo4 --contexts 131072 --stage-buffers $b > $OUT/kernel_times_buffers$b.txt 2>&1; echo "buffers $b rc $?"
  grep "turbo_decode\|cudnn_generated" $OUT/kernel_times_buffers$b.txt | cut -c1-140; date -u +%T
done
