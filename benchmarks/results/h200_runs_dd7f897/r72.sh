# issue 9, session 44 after r71.sh: the 8-layer stack at 128K again, buf2, the head and 0f6aa88 taking turns, three times
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
S="--prefill 0 --steps 16 --rounds 3"
for i in 3 4 5; do
 for t in devrun/v_buf2 . devrun/t_0f6aa88; do
  n=$(basename $(realpath $t))
  (cd $t && PYTHONPATH=. timeout 30 python benchmarks/decode_attention.py $S --contexts 131072 --schemes turbo4 > /tmp/s.txt 2>&1; echo "$n rc $?")
  grep "^| turbo4\|^| fp16" /tmp/s.txt | head -2 | tee -a $OUT/stack128_$n.txt
 done
done; date -u +%T
