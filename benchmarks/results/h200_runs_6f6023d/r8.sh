# session 26, round 4: b4a5294 against the change, alternating processes (SmolLM2, 8K),
# then the 8-layer decode stack with the change
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/p1 .smol2/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
git log -1 --format='%h' | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
timeout 340 python benchmarks/ab_packages.py --versions devrun/old installed --rounds 5 -- \
  --model /tmp/smol --context 8000 --steps 64 --caches fp16 turbo4 2>&1 | tee $OUT/ab.txt | tail -n 16
date -u

timeout 60 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 32768 131072 \
  --schemes turbo4 --out $OUT/decode_attention.md > /tmp/da.txt 2>&1; tail -n 8 /tmp/da.txt
date -u
