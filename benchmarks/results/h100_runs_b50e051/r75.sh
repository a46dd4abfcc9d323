# issue 9, session 45 after r74.sh: the 128K layouts comparison (turbo4/turbo4v2, dynamic/static, one process) four more times
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
for i in 2 3 4 5; do
timeout 70 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 5 --contexts 131072 --schemes turbo4 turbo4@static turbo4v2@dynamic turbo4v2@static > /tmp/l.txt 2>&1; echo "run $i rc $?"
grep "^| " /tmp/l.txt | head -7 | tee -a $OUT/layouts_128k_runs2to5.txt | cut -d'|' -f2-7; date -u +%T
done
