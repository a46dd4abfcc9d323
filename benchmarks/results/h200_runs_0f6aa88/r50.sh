# issue 9, session 40 (main 0f6aa88) on the H200 after devrun/r49.sh: the GPU tests of values on the tensor cores at head dim 256 and of the chunked merge, then ncu profiles of the default kernel where a launch is mostly fixed time (Gemma 32K, SmolLM2 8K)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
timeout 120 python -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels.py -k "tensor_cores_at_head_dim_256 or many_slices" 2>&1 | tail -n 8 | tee $OUT/tests_kernels_256.txt; date -u +%T
prof() {  # name context q kv d
  PYTHONPATH=. timeout 100 ncu --set full --import-source no --kernel-name regex:turbo_decode --launch-skip 40 --launch-count 1 -o /tmp/R_$1 \
    python benchmarks/kernel_times.py --run turbo4 $2 $3 $4 $5 0 0 0 0 0 > $OUT/ncu_log_$1.txt 2>&1; echo ncu $1 rc $?
  ncu --import /tmp/R_$1.ncu-rep --page details > $OUT/turbo4_$1_details.txt 2>&1
  ncu --import /tmp/R_$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/turbo4_$1_sass.csv.gz
  grep -E "^  [A-Za-z]|Duration|Elapsed Cycles|SM Frequency|Warp Cycles Per Issued|Issue Slots Busy|Memory Throughput|Achieved Occupancy" $OUT/turbo4_$1_details.txt | head -40
  date -u +%T
}
prof gemma_32k 32768 4 1 256
prof smollm2_8k 8192 9 3 64
