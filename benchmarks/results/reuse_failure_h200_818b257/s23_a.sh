# the reuse failure's prefix alone, in fresh processes: buffer cache poisoned before it
# or not, turbo4 or mlx-lm's caches, the experts' sorted gather or not, kernels on/off;
# and the original failing selection as a control
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u; git log -1 --format=%h 2>/dev/null
cp devrun/s23_probe.py tests/test_s23_probe.py
P="timeout 300 python -m pytest -q -s -p no:cacheprovider --tb=line tests/test_s23_probe.py"
v() { (export MLX_PTX_CACHE_DIR=/tmp/ptx_$1 S23_NAME=$1; shift; env "$@" $P > $OUT/s23_$S23_NAME.txt 2>&1) & }
v t_clean S23_CACHE=turbo4
v t_nan S23_POISON=ffffffff
v t_half S23_POISON=3e003e00
v t_nan_10 S23_POISON=ffffffff S23_SHARED=10
v p_nan S23_CACHE=plain S23_POISON=ffffffff
v p_half S23_CACHE=plain S23_POISON=3e003e00
v t_nan_off S23_POISON=ffffffff MLX_LM_TURBO_KERNEL=off
v t_nan_nosort S23_POISON=ffffffff S23_NOSORT=1
v t_nan_tap S23_POISON=ffffffff S23_TAP=1
v p_nan_nosort S23_CACHE=plain S23_POISON=ffffffff S23_NOSORT=1
v t_half_tap S23_POISON=3e003e00 S23_TAP=1
(export MLX_PTX_CACHE_DIR=/tmp/ptx_control; timeout 300 python -m pytest -q -p no:cacheprovider --tb=line tests/test_chunk_invariance.py -k "sliding_window_models and gpt_oss or reused_or_reloaded" > $OUT/control.txt 2>&1) &
wait
grep -h "^S23" $OUT/s23_*.txt
for f in $OUT/*.txt; do echo "== $f"; grep -E "passed|failed|Error|error" $f | cut -c1-300 | tail -n 4; done
date -u
