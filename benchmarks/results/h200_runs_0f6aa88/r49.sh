# issue 9, session 40 (main 0f6aa88): on an H200 the stack of five schemes and every width's kernel at 128K (the README's H200 table is 40cbf65's), then Gemma's shape with values summed on the tensor cores at head dim 256 against the default
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
PYTHONPATH=. timeout 130 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/stack.md > $OUT/stack.txt 2>&1; echo rc $?
grep "^| " $OUT/stack.txt | cut -d'|' -f2-6,11-12; date -u +%T
PYTHONPATH=. timeout 130 python benchmarks/kernel_times.py --caches fp16 turbo4 turbo4v2 turbo5v3 turbo3 turbo2 --contexts 131072 > $OUT/kernel_times.txt 2>&1; echo rc $?
grep "turbo_decode\|cudnn_generated" $OUT/kernel_times.txt; date -u +%T
T=$OUT/kernel_times_gemma.txt; : > $T
G="--heads 4 1 256 --contexts 32768 131072 --caches turbo4"
for x in "" "--value-mma-max-dim 256" "" "--value-mma-max-dim 256"; do
  echo "== $x $(date -u +%T)" >> $T
  PYTHONPATH=. timeout 90 python benchmarks/kernel_times.py $G $x >> $T 2>&1 || echo "rc $?" >> $T
done
grep "==\|turbo_decode\|rc " $T; date -u +%T
