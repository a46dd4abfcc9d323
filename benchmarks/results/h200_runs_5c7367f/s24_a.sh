# session 24, call 3: SmolLM2 assembled; whole-model decode split with and without CUDA graphs;
# the 8-layer decode benchmark at the present main; needles on SmolLM2 at 8K
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/p1 .smol2/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
git log -1 --format='%h %s' | tee -a $OUT/device.txt; date -u | tee -a $OUT/device.txt
S="timeout 150 python benchmarks/decode_step_split.py --model /tmp/smol --context 8000 --steps 64 --rounds 3 --caches fp16 turbo4"
$S --out $OUT/split_graphs.md > /tmp/split_graphs.txt 2>&1; tail -n 6 /tmp/split_graphs.txt
date -u
MLX_USE_CUDA_GRAPHS=0 $S --out $OUT/split_nographs.md > /tmp/split_nographs.txt 2>&1; tail -n 6 /tmp/split_nographs.txt
date -u
timeout 200 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 32768 131072 \
  --schemes turbo4 --out $OUT/decode_attention.md > /tmp/decode_attention.txt 2>&1
tail -n 22 /tmp/decode_attention.txt
date -u
B="mlx-lm-turbo bench --memory-context 0 --no-speed --decode 16 --contexts 512 --needle-trials 4 --model /tmp/smol --needle-contexts 8000 --needle-depths 0.1 0.5 0.9"
(mkdir -p /tmp/na && cd /tmp/na && timeout 170 $B --caches fp16 turbo4 --out /tmp/na > /tmp/na.txt 2>&1) &
(mkdir -p /tmp/nb && cd /tmp/nb && MLX_PTX_CACHE_DIR=/tmp/ptx_nb timeout 170 $B --caches turbo5v3 turbo4v2 --out /tmp/nb > /tmp/nb.txt 2>&1) &
wait
tail -n 8 /tmp/na.txt /tmp/nb.txt
cp /tmp/na/*.json $OUT/needles_a.json 2>/dev/null; cp /tmp/nb/*.json $OUT/needles_b.json 2>/dev/null
date -u
