# issue 9: the whole-model bench with six rounds timed in turn, then ncu on turbo4's kernel at 128K
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/p1 /tmp/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt; lscpu | head -20 > $OUT/host.txt
date -u > $OUT/dates.txt
mkdir -p /tmp/b && (cd /tmp/b && timeout 330 mlx-lm-turbo bench --model /tmp/smol --contexts 8000 --decode 64 \
  --caches fp16 turbo4 --speed-rounds 6 --needle-contexts --memory-context 0 --out /tmp/b > $OUT/bench.txt 2>&1; echo rc $? >> $OUT/bench.txt)
cp /tmp/b/results.json $OUT/bench_smollm2_8k.json; grep "^| \|Speeds\|rc " $OUT/bench.txt; date -u >> $OUT/dates.txt
which ncu > $OUT/ncu_path.txt 2>&1
timeout 200 ncu --set full --import-source no --kernel-name regex:turbo_decode --launch-skip 40 --launch-count 1 -o /tmp/R \
  python benchmarks/kernel_times.py --run turbo4 131072 32 8 128 > $OUT/ncu_log.txt 2>&1; echo ncu rc $?
ncu --import /tmp/R.ncu-rep --page details > $OUT/turbo4_131072_details.txt 2>&1
ncu --import /tmp/R.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/turbo4_131072_sass.csv.gz
grep -E "Duration|Registers Per|Executed Instructions  |Issued Warp|Achieved Occ" $OUT/turbo4_131072_details.txt
date -u >> $OUT/dates.txt
timeout 150 python benchmarks/kernel_times.py --caches fp16 turbo4 --contexts 131072 > $OUT/kernel_times.txt 2>&1; cat $OUT/kernel_times.txt
date -u >> $OUT/dates.txt
