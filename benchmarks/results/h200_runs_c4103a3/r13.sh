# session 27, round 4: the literal whole-model measure, mlx-lm-turbo bench's decode
# speed on SmolLM2 at 8K (teacher-forced steps), fp16 and turbo4
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/p1 /tmp/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
date -u
mkdir -p /tmp/b && cd /tmp/b && timeout 150 mlx-lm-turbo bench --model /tmp/smol --contexts 8000 --decode 64 \
  --caches fp16 turbo4 --needle-contexts --memory-context 0 --out /tmp/b > $OUT/bench.txt 2>&1
cp /tmp/b/results.json $OUT/bench_smollm2_8k.json; grep "^| \|decode\|Error" $OUT/bench.txt | tail -6; date -u
