# issue 9, session 32: the README's 8-layer stack on the warm H100, right after r22a.sh (run inline)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || exit 1; date -u +%T
timeout 400 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 32768 131072 \
  --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/decode_attention.md > $OUT/da.txt 2>&1; echo rc $?
grep "^| " $OUT/da.txt | head -40; date -u +%T
