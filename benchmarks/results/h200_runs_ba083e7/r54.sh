# issue 9, session 41: ncu full profiles (SASS samples) of turbo4's kernel at the working tree, exact items spread over the warps: SmolLM2's shape at 8K and the issue's at 4K
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
prof() {  # name context q kv d
  PYTHONPATH=. timeout 100 ncu --set full --import-source no --kernel-name regex:turbo_decode --launch-skip 40 --launch-count 1 -o /tmp/R_$1 \
    python benchmarks/kernel_times.py --run turbo4 $2 $3 $4 $5 0 0 0 0 0 > $OUT/ncu_log_$1.txt 2>&1; echo ncu $1 rc $?
  ncu --import /tmp/R_$1.ncu-rep --page details > $OUT/turbo4_$1_details.txt 2>&1
  ncu --import /tmp/R_$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/turbo4_$1_sass.csv.gz
  grep -E "^  [A-Za-z]|Duration|Elapsed Cycles|SM Frequency|Warp Cycles Per Issued|Issue Slots Busy|Memory Throughput|Achieved Occupancy" $OUT/turbo4_$1_details.txt | head -40
  date -u +%T
}
prof smollm2_8k 8192 9 3 64
prof issue_4k 4096 32 8 128
