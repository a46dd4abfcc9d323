source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
ps aux | grep -c "[d]ecode_host_profile"; pkill -f decode_host_profile; sleep 1
for c in fp16 turbo4; do
  timeout 200 py-spy record --native --rate 50 --format raw --output $OUT/pyspy_$c.txt -- \
    python benchmarks/decode_host_profile.py --model /tmp/smol --cache $c --context 8000 --seconds 10 2>&1 | grep -v "behind in sampling\|^py-spy> You\|^$"
done
python benchmarks/decode_host_profile.py --summarize $OUT/pyspy_fp16.txt $OUT/pyspy_turbo4.txt --top 30 > $OUT/pyspy_summary.md; head -c 5000 $OUT/pyspy_summary.md
date -u
timeout 150 python benchmarks/decode_step_split.py --model /tmp/smol --context 8000 --steps 64 --rounds 3 --caches fp16 turbo4 --out $OUT/split.md > /tmp/split.txt 2>&1; tail -n 4 /tmp/split.txt
date -u
