# issue 9, session 40: turbo4's kernel where a launch is short, three trees in turn: 5f535ea (devrun/old: level-pair tables filled by global loads, one warp for the exact items), 3991528 (devrun/fill: tables filled by shuffles), the working tree (and the exact items spread over the warps): SmolLM2's shape (9 / 3 / 64) at 8K, the issue's (32 / 8 / 128) at 4K and Gemma 3's (4 / 1 / 256) at 32K, in turn
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
# each tree's package must be the one imported (an editable install would win over PYTHONPATH; the kernels' names carry their sources' digests too)
for tree in devrun/old devrun/fill .; do PYTHONPATH=$tree python -c "import mlx_lm_turbo as m; print('$tree ->', m.__file__)"; done | tee $OUT/trees.txt
T=$OUT/kernel_times_fill.txt; : > $T
for trees in "devrun/old devrun/fill ." "devrun/old ."; do
  for tree in $trees; do
    for shape in "--heads 9 3 64 --contexts 8192" "--contexts 4096" "--heads 4 1 256 --contexts 32768"; do
      echo "== $tree $shape $(date -u +%T)" >> $T
      PYTHONPATH=$tree timeout 60 python benchmarks/kernel_times.py $shape --caches turbo4 >> $T 2>&1 || echo "rc $?" >> $T
    done
  done
done
grep "==\|turbo_decode\|rc " $T
# Is a short launch's SM-idle half a straggler (one SM active throughout) or time outside every block?
for run in "8192 9 3 64" "32768 4 1 256" "4096 32 8 128"; do
  echo "== sm active cycles, turbo4 $run"
  PYTHONPATH=. timeout 60 ncu --metrics sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max,gpu__time_duration.sum \
    --kernel-name regex:turbo_decode --launch-skip 40 --launch-count 1 python benchmarks/kernel_times.py --run turbo4 $run 0 0 0 0 0 2>&1 | grep -E "sm__|gpu__" | tee -a $OUT/sm_active.txt
done
