# issue 9, session 45 (main b50e051) on the device: turbo4 and turbo4v2 with either shared-memory layout in one process at 128K, then every width's 8-layer stack at 4K/32K/128K
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; git log -1 --format=%h 2>/dev/null; date -u +%T
timeout 240 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 5 --contexts 131072 --schemes turbo4 turbo4@static turbo4v2@dynamic turbo4v2@static --out $OUT/layouts_128k.md > $OUT/layouts_128k.txt 2>&1; echo "layouts rc $?"
grep "^| " $OUT/layouts_128k.txt | head -14 | cut -c1-150; date -u +%T
timeout 300 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 --out $OUT/widths.md > $OUT/widths.txt 2>&1; echo "widths rc $?"
grep "^| " $OUT/widths.txt | head -40 | cut -c1-150; date -u +%T
