# test_chunk_invariance.py with GPT-OSS's experts unsorted on MLX-CUDA: the failing
# selections repeated, and the whole file once
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u
T="timeout 300 python -m pytest -q -p no:cacheprovider --tb=line tests/test_chunk_invariance.py"
for i in 1 2 3; do (export MLX_PTX_CACHE_DIR=/tmp/ptx_a$i; $T -k reused_or_reloaded > $OUT/f_alone$i.txt 2>&1) & done
for i in 1 2; do (export MLX_PTX_CACHE_DIR=/tmp/ptx_s$i; $T -k "sliding_window_models and gpt_oss or reused_or_reloaded" > $OUT/f_sel$i.txt 2>&1) & done
(export MLX_PTX_CACHE_DIR=/tmp/ptx_w; $T > $OUT/f_file.txt 2>&1) &
wait
for f in $OUT/*.txt; do echo "== $f"; grep -h "passed\|failed\|FAILED\|Error" $f | cut -c1-300; done
date -u
