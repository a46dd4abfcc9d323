# issue 9, session 45 (main b5fdd53, kernels as b50e051): every width's launch alone at 128K (ncu), then full ncu profiles of turbo3 and turbo4 at 128K: why turbo3, with turbo4's instruction count and 24% fewer bytes, runs behind it
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
S=$(date +%s)
timeout 100 python benchmarks/kernel_times.py --caches fp16 turbo4 turbo3 turbo2 turbo4v2 --contexts 131072 > $OUT/kernel_times.txt 2>&1; echo "kernel_times rc $?"
grep "turbo_decode\|cudnn_generated" $OUT/kernel_times.txt | cut -c1-130; date -u +%T
prof() {  # cache
  [ $(( $(date +%s) - S )) -lt 200 ] || { echo "no time for the $1 profile"; return; }
  timeout 80 ncu --set full --import-source no --kernel-name regex:turbo_decode --launch-skip 40 --launch-count 1 -o /tmp/R_$1 \
    python benchmarks/kernel_times.py --run $1 131072 32 8 128 0 0 0 0 0 > /tmp/ncu_log_$1.txt 2>&1; echo ncu $1 rc $?
  ncu --import /tmp/R_$1.ncu-rep --page details > $OUT/$1_131072_b50e051_details.txt 2>&1
  ncu --import /tmp/R_$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/$1_131072_b50e051_sass.csv.gz
  grep -i "^    Duration\|Executed Instructions  \|Issued Ipc Active\|Eligible Warps\|Shared.*Bank" $OUT/$1_131072_b50e051_details.txt | head -8
  date -u +%T
}
prof turbo3
prof turbo4
