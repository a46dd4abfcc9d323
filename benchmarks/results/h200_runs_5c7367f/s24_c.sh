# session 24, round 3: the chunk-invariance file whole on the H200 (three shards); needles on
# SmolLM2 at 8K over five depths; then, the package uninstalled, MLX's sorted gather_mm against
# the CPU with MLX and mlx-lm alone
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/p1 .smol2/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
git log -1 --format='%h %s'; date -u
T="timeout 420 python -m pytest -q -p no:cacheprovider tests/test_chunk_invariance.py"
(export MLX_PTX_CACHE_DIR=/tmp/ptx_1; $T -k "step_size" > $OUT/ci_1.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/ptx_2; $T -k "reused or server or trimmed or uncompressed" > $OUT/ci_2.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/ptx_3; $T -k "measures_and_reads or batch_reads" > $OUT/ci_3.txt 2>&1) &
B="timeout 420 mlx-lm-turbo bench --memory-context 0 --no-speed --decode 16 --contexts 512 --needle-trials 4 --model /tmp/smol --needle-contexts 8000 --needle-depths 0.1 0.3 0.5 0.7 0.9"
(mkdir -p /tmp/n1 && cd /tmp/n1 && MLX_PTX_CACHE_DIR=/tmp/ptx_n1 $B --caches fp16 turbo4 --out /tmp/n1 > /tmp/n1.txt 2>&1; cp /tmp/n1/results.json $OUT/needles_fp16_turbo4.json) &
(mkdir -p /tmp/n2 && cd /tmp/n2 && MLX_PTX_CACHE_DIR=/tmp/ptx_n2 $B --caches fp16 turbo5v3 turbo4v2 --out /tmp/n2 > /tmp/n2.txt 2>&1; cp /tmp/n2/results.json $OUT/needles_turbo5v3_turbo4v2.json) &
wait
date -u
for f in $OUT/ci_*.txt; do echo "== $f"; tail -n 3 $f; done
grep -h "^| " /tmp/n1.txt /tmp/n2.txt
pip uninstall -y -q mlx-lm-turbo
for i in 1 2 3; do python devrun/gather_mm_repro.py --mode mlp --lengths 10 40 80 --rounds 10 | tail -n 1; done > $OUT/repro.txt 2>&1
for i in 1 2 3; do python devrun/gather_mm_repro.py --mode model --lengths 10 40 --rounds 5 | tail -n 1; done >> $OUT/repro.txt 2>&1
python devrun/gather_mm_repro.py --mode mlp --lengths 10 40 80 --rounds 3 >> $OUT/repro.txt 2>&1
cat $OUT/repro.txt
date -u
