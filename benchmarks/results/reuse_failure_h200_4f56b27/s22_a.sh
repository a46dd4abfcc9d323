# the sliding-window reuse failure: poisoned recycled memory in a fresh process; kernel
# calls recorded clean and poisoned; the test file's failing selection without CUDA graphs
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u
cp devrun/s22_probe.py tests/test_s22_probe.py
python - <<'PY'
src = open("tests/test_chunk_invariance.py").read()
anchor = "        got = run(model, PROMPT[shared:], reused, 2048)\n"
src = src.replace(anchor, anchor + '        print("CI", shared, got[0], cold[0], (got[1] - cold[1]).abs().max().item(), flush=True)\n')
open("tests/test_s22_ci.py", "w").write(src)
PY
P="timeout 400 python -m pytest -q -s -p no:cacheprovider --tb=line"
probe() { (export MLX_PTX_CACHE_DIR=/tmp/ptx_$1 S22_NAME=$1; shift; env "$@" $P tests/test_s22_probe.py > $OUT/p_$S22_NAME.txt 2>&1) & }
probe clean
probe nan S22_POISON=ffffffff
probe junk S22_POISON=3e003e00
probe nan_off S22_POISON=ffffffff MLX_LM_TURBO_KERNEL=off
probe nan_encoff S22_POISON=ffffffff S22_ENCODE_OFF=1
probe nan_nographs S22_POISON=ffffffff MLX_USE_CUDA_GRAPHS=0
probe dump_clean S22_DUMP=$OUT/dump_clean.npz
probe dump_nan S22_POISON=ffffffff S22_DUMP=$OUT/dump_nan.npz
probe dump_junk S22_POISON=3e003e00 S22_DUMP=$OUT/dump_junk.npz
(export MLX_PTX_CACHE_DIR=/tmp/ptx_sel MLX_USE_CUDA_GRAPHS=0; $P tests/test_s22_ci.py -k "sliding_window_models or reused_or_reloaded" > $OUT/sel_b_nographs.txt 2>&1) &
wait
for f in $OUT/*.txt; do echo "== $f"; grep -E "S22|CI |FAILED|Error|passed|failed" $f | cut -c1-260 | tail -n 8; done
date -u
