# issue 9, session 39: TARGET_BLOCKS 512 against 1024 at Gemma's shape (one KV head) and the issue's, turbo4 at 128K, side by side in one call (main 629cb85)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
T=$OUT/kernel_times_target_blocks.txt; : > $T
for x in "--heads 4 1 256" "--heads 4 1 256 --target-blocks 1024" "" "--target-blocks 1024" "--heads 4 1 256" "--heads 4 1 256 --target-blocks 1024"; do
  echo "== $x $(date -u +%T)" >> $T
  PYTHONPATH=. timeout 55 python benchmarks/kernel_times.py $x --contexts 131072 --caches turbo4 >> $T 2>&1 || echo "rc $?" >> $T
done
grep "==\|turbo_decode\|rc " $T; date -u +%T
