# the failing selection with every block's input, attention and MLP outputs of the reuse
# test's prefix compared against the CPU, repeated (taps make it fail only sometimes);
# and the reuse tests alone ([10] then [40])
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u
python devrun/s23_make_ci.py
export PYTHONPATH=$PWD/devrun
C="timeout 330 python -m pytest -q -s -p no:cacheprovider --tb=line tests/test_s23_ci.py -k"
K="sliding_window_models and gpt_oss or reused_or_reloaded"
c() { (export MLX_PTX_CACHE_DIR=/tmp/ptx_$1 S23_NAME=$1; k=$2; shift 2; env "$@" $C "$k" > $OUT/d_$S23_NAME.txt 2>&1) & }
for i in 1 2 3 4 5 6 7 8; do c tap$i "$K" S23_TAP=1; done
c alone1 "reused_or_reloaded" S23_X=1
c alone2 "reused_or_reloaded" S23_X=1
c alonetap1 "reused_or_reloaded" S23_TAP=1
c alonetap2 "reused_or_reloaded" S23_TAP=1
wait
for f in $OUT/*.txt; do echo "== $f"; grep -h "S23\|passed\|failed" $f | cut -c1-400; done > $OUT/summary.log
cat $OUT/summary.log
date -u
