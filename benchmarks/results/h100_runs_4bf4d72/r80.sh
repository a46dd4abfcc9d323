# issue 9, session 46 (main 4bf4d72): every width's 8-layer stack at 4K/32K/128K three times at the head (turbo3 >= turbo4 at 128K end to end after dc08e8a?)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
for i in 1 2 3; do
timeout 170 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 --out $OUT/widths_$i.md > /tmp/w.txt 2>&1; echo "widths $i rc $?"; tail -n 3 /tmp/w.txt | grep -i error
grep "^| " $OUT/widths_$i.md | cut -d'|' -f2-6; date -u +%T
done
