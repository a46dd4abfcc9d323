source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
for c in fp16 turbo4; do
  timeout 200 py-spy record --native --rate 50 --format raw --output $OUT/pyspy_$c.txt -- \
    python benchmarks/decode_host_profile.py --model /tmp/smol --cache $c --context 8000 --seconds 10 2>&1 | grep -v "behind in sampling\|^py-spy> You\|^$\|transformers"
done
python benchmarks/decode_host_profile.py --summarize $OUT/pyspy_fp16.txt $OUT/pyspy_turbo4.txt --top 40 > $OUT/pyspy_summary.md
date -u
