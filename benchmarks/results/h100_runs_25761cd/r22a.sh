# issue 9, session 32: the unrolled variants and launch shapes timed side by side at 128K (ncu)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$OUT/kernel_times.txt; : > $T
kt() {  # variant warps buffers caches...
  v=$1; w=$2; b=$3; shift 3
  echo "== $v $w $b $(date -u +%T)" >> $T
  if [ $v = main ]; then pp=; else pp=devrun/variants/$v; fi
  PYTHONPATH=$pp timeout 100 python benchmarks/kernel_times.py --caches "$@" --contexts 131072 \
    --warps-per-sm $w --stage-buffers $b >> $T 2>&1 || echo "rc $?" >> $T
}
kt main 16 0 fp16 turbo4
kt unroll_keys 16 0 turbo4
kt unroll_both 16 0 turbo4
kt main 20 1 turbo4
kt unroll_keys 20 1 turbo4
kt unroll_both 20 1 turbo4
kt main 24 1 turbo4
echo "== end $(date -u +%T)" >> $T
grep -v "^|---\|^| cache" $T | grep "==\|turbo_decode\|cudnn_generated\|rc "
