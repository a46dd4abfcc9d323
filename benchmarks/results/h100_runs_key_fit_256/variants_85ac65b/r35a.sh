# issue 9, next session (part a: kernel times, main's every-width tests): main (head, 85ac65b) against hs (variant/key-half-shuffles: 5-bit keys' shuffles fill half an A register, two MMAs a k step) k256 (variant/key-mma-256: turbo5v3 at head dim 256 on the tensor cores) and both (variant/key-shuffles-both): kernel alone side by side, GPU kernel tests of both
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
T=$OUT/kernel_times.txt; : > $T
kt() {  # variant extra-args caches...
  v=$1; x=$2; shift 2
  echo "== $v $x $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 120 python benchmarks/kernel_times.py $x --caches "$@" >> $T 2>&1 || echo "rc $?" >> $T
}
kt head "--contexts 131072" turbo4 turbo5v3
kt hs "--contexts 131072" turbo5v3
kt head "--contexts 131072 --heads 4 1 256" turbo4 turbo5v3
kt k256 "--contexts 131072 --heads 4 1 256" turbo5v3
kt hs "--contexts 131072 --heads 4 1 256" turbo5v3
kt both "--contexts 131072 --heads 4 1 256" turbo5v3
kt head "--contexts 131072" turbo5v3
echo "== end $(date -u +%T)" >> $T
grep "==\|turbo_decode\|cudnn_generated\|rc " $T
set -o pipefail
timeout 120 python -m pytest -q --tb=line -p no:cacheprovider tests/test_kernels.py -k "every_width" 2>&1 | tail -n 6 | tee $OUT/tests_kernels_main.txt
