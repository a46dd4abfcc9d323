# issue 9, session 45 (main b50e051): every width's 8-layer stack at 4K/32K/128K twice, for the README's table at the head
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
for i in 1 2; do
timeout 150 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 --out $OUT/widths_$i.md > /dev/null 2>&1; echo "widths $i rc $?"
grep "^| " $OUT/widths_$i.md | cut -d'|' -f2-7; date -u +%T
done
