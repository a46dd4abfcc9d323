# session 24, round 2: where the queueing of a turbo decode layer goes (op costs with a queue
# column, outputs varied; SmolLM2's attention shapes over 30 layers; the 8-layer stack at 4K)
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
git log -1 --format='%h %s'; date -u
timeout 200 python benchmarks/op_costs.py --depth 30 --steps 50 --context 8192 > $OUT/op_costs.txt 2>&1; cat $OUT/op_costs.txt
date -u
timeout 150 python benchmarks/decode_attention.py --prefill 0 --steps 32 --rounds 3 --layers 30 --q-heads 9 --kv-heads 3 \
  --head-dim 64 --contexts 8192 --recent-exact 16 --out $OUT/attention_smollm2_shapes.md > /tmp/a.txt 2>&1; tail -n 4 /tmp/a.txt
date -u
timeout 150 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 131072 --recent-exact 16 \
  --out $OUT/attention_8layers.md > /tmp/b.txt 2>&1; tail -n 6 /tmp/b.txt
date -u
