# issue 9: variant/chunked-merge against main, second call: the kernel alone at Gemma's shape for the other widths, and the stack at the issue's shape
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
T=$OUT/kernel_times_widths.txt; : > $T
for v in main chunk; do
  echo "== $v --heads 4 1 256 $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 100 python benchmarks/kernel_times.py --heads 4 1 256 --contexts 131072 --caches turbo2 turbo3 turbo4v2 turbo5v3 >> $T 2>&1 || echo "rc $?" >> $T
done
grep "==\|turbo_decode\|rc " $T
for v in main chunk; do
  PYTHONPATH=devrun/variants/$v timeout 90 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
    --contexts 32768 131072 --schemes turbo4 --out $OUT/stack_issue_$v.md > /dev/null 2>&1; echo "stack $v rc $?"
  grep "^| " $OUT/stack_issue_$v.md | cut -d'|' -f2-6,11-12
done; date -u +%T
