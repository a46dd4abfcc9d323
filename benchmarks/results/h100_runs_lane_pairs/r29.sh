# issue 9, session 35: head (b8296f5) against lp (4-bit keys' and values' A registers read from a 256-pair table held 16 times side by side, one staging buffer): kernel alone at 128K (head also with one buffer), lp's GPU tests and stack, then ncu profiles
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
S=$(date +%s)
mkdir -p devrun/variants/lp && cp -r mlx_lm_turbo devrun/variants/lp/
T=$OUT/kernel_times.txt; : > $T
kt() {  # variant extra-args caches...
  v=$1; x=$2; shift 2
  echo "== $v $x $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 120 python benchmarks/kernel_times.py $x --caches "$@" --contexts 131072 >> $T 2>&1 || echo "rc $?" >> $T
}
kt head "" turbo4 turbo4v2
kt lp "" fp16 turbo4 turbo4v2
kt head "--stage-buffers 1" turbo4
kt lp "" turbo4
kt head "" turbo4
echo "== end $(date -u +%T)" >> $T
grep "==\|turbo_decode\|cudnn_generated\|rc " $T
set -o pipefail
timeout 160 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "every_width or staging or batch_rows or long_context or (head_dims and float16)" 2>&1 | tee $OUT/tests_kernels.txt | tail -n 4
date -u +%T
PYTHONPATH=devrun/variants/lp timeout 100 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/stack_lp.md > $OUT/stack_lp.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_lp.txt | cut -d'|' -f2-6,11-12; date -u +%T
PYTHONPATH=devrun/variants/head timeout 60 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 --out $OUT/stack_head.md > $OUT/stack_head.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_head.txt | cut -d'|' -f2-6,11-12; date -u +%T
prof() {  # variant
  [ $(( $(date +%s) - S )) -lt 470 ] || { echo "no time for the $1 profile"; return; }
  PYTHONPATH=devrun/variants/$1 timeout 90 ncu --set full --import-source no --kernel-name regex:turbo_decode --launch-skip 40 --launch-count 1 -o /tmp/R_$1 \
    python benchmarks/kernel_times.py --run turbo4 131072 32 8 128 0 0 > $OUT/ncu_log_$1.txt 2>&1; echo ncu $1 rc $?
  ncu --import /tmp/R_$1.ncu-rep --page details > $OUT/turbo4_131072_$1_details.txt 2>&1
  ncu --import /tmp/R_$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/turbo4_131072_$1_sass.csv.gz
  date -u +%T
}
prof lp
prof head
