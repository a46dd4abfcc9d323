# issue 9: variant/chunked-merge against main, third call: the stack at the issue's shape in alternating order (chunk, main, chunk, main) to see the spread, then turbo5v3 at Gemma's shape
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
for v in chunk main chunk main; do
  PYTHONPATH=devrun/variants/$v timeout 70 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
    --contexts 131072 --schemes turbo4 --out $OUT/s.md > /dev/null 2>&1; echo "stack $v rc $? $(date -u +%T)"
  grep "^| " $OUT/s.md | cut -d'|' -f2-6,11-12 | tail -2; cat $OUT/s.md >> $OUT/stack_issue_alternating.md; rm $OUT/s.md
done
T=$OUT/kernel_times_turbo5v3.txt; : > $T
for v in main chunk; do
  echo "== $v --heads 4 1 256 $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 60 python benchmarks/kernel_times.py --heads 4 1 256 --contexts 131072 --caches turbo5v3 >> $T 2>&1 || echo "rc $?" >> $T
done
grep "==\|turbo_decode\|rc " $T; date -u +%T
