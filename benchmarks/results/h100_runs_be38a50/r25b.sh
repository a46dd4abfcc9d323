# issue 9, session 34: the 8-layer stack, the winner of r25a against base
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
W=$(cat /tmp/winner 2>/dev/null || echo v1); echo "winner $W"; date -u +%T
[ -d devrun/variants/v1 ] || { mkdir -p devrun/variants/v1 && cp -r mlx_lm_turbo devrun/variants/v1/; }
PYTHONPATH=devrun/variants/$W timeout 300 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/stack_$W.md > $OUT/stack_$W.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_$W.txt | cut -d'|' -f2-6,11-12; date -u +%T
PYTHONPATH=devrun/variants/base timeout 150 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 --out $OUT/stack_base.md > $OUT/stack_base.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_base.txt | cut -d'|' -f2-6,11-12; date -u +%T
