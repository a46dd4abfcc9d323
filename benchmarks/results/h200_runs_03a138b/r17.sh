# session 28: the 8-layer stack for every scheme the README's speed table lists, at the head
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; date -u > $OUT/dates.txt
timeout 330 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 32768 131072 \
  --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/decode_attention.md > $OUT/da.txt 2>&1; echo rc $?
grep "^| " $OUT/da.txt | head -30; date -u >> $OUT/dates.txt
# the 512-block attention-alone anomaly of decode_h200_c4103a3.md: with the kernel forced on
# (a call the kernel cannot take is then an error naming why), and in the other order
MLX_LM_TURBO_KERNEL=on timeout 150 python benchmarks/decode_kernel_sweep.py --contexts 131072 --warps 4 \
  --targets 512 660 --steps 4 > $OUT/sweep_on.txt 2>&1; echo rc $?; tail -n 6 $OUT/sweep_on.txt
timeout 150 python benchmarks/decode_kernel_sweep.py --contexts 131072 --warps 4 \
  --targets 660 512 --steps 4 > $OUT/sweep_660_512.txt 2>&1; echo rc $?; tail -n 4 $OUT/sweep_660_512.txt
date -u >> $OUT/dates.txt
