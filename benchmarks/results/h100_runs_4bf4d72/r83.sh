# issue 9, session 46 (main 4bf4d72): every width at 128K five times, one step at a time (turbo3 against turbo4 over more runs; issue 9's 1.5x for turbo4 is set on the H200)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
for i in 1 2 3 4 5; do
timeout 80 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 --out $OUT/w128_$i.md > /dev/null 2>&1; echo "run $i rc $?"
grep "^| " $OUT/w128_$i.md | cut -d'|' -f2-6; date -u +%T
done
