# the short failing selection with every blockwise attention and dequantization checked
# against the CPU stream (uncompiled); with and without MLX_DISABLE_COMPILE
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u
python - <<'PY'
src = open("tests/test_chunk_invariance.py").read()
anchor = "        got = run(model, PROMPT[shared:], reused, 2048)\n"
src = src.replace(anchor, anchor + '        print("CI", shared, got[0], cold[0], (got[1] - cold[1]).abs().max().item(), flush=True)\n')
old = '    model(mx.array([PROMPT[:shared]]), cache=prefix)\n'
assert src.count(old) == 1
src = src.replace(old, '    print("S22 prefix", shared, flush=True)\n' + old + '    print("S22 prefix done", flush=True)\n')
open("tests/test_s22_ci.py", "w").write(src)
PY
export PYTHONPATH=$PWD/devrun S22_CHECK=1
P="timeout 300 python -m pytest -q -s -p no:cacheprovider -p s22_plugin --tb=line tests/test_s22_ci.py"
K="sliding_window_models and gpt_oss or reused_or_reloaded"
(export MLX_PTX_CACHE_DIR=/tmp/p1; $P -k "$K" > $OUT/d_check.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/p2 MLX_DISABLE_COMPILE=1; $P -k "$K" > $OUT/d_check_nocompile.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/p3; $P -k "reused_or_reloaded" > $OUT/d_check_alone.txt 2>&1) &
wait
for f in $OUT/*.txt; do echo "== $f"; grep -E "MISMATCH|maxdiff [0-9.e+-]*[1-9]|S22 prefix|CI |FAILED|Error|passed|failed" $f | grep -vE "maxdiff (0|[0-9.]+e-0[4-9])" | cut -c1-230 | head -n 30; done
date -u
