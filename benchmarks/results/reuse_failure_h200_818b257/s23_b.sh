# where the reuse failure's prefix goes wrong: (1) the probe after the failing selection's
# earlier test in the same process (S23_WARM); (2) the failing selection itself with the
# reuse test's prefix compared against the CPU (test_s23_ci.py), taps of every block or none
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u
cp devrun/s23_probe.py tests/test_s23_probe.py
python devrun/s23_make_ci.py
export PYTHONPATH=$PWD/devrun
P="timeout 330 python -m pytest -q -s -p no:cacheprovider --tb=line tests/test_s23_probe.py"
C="timeout 330 python -m pytest -q -s -p no:cacheprovider --tb=line tests/test_s23_ci.py -k"
K="sliding_window_models and gpt_oss or reused_or_reloaded"
v() { (export MLX_PTX_CACHE_DIR=/tmp/ptx_$1 S23_NAME=$1 S23_WARM=1; shift; env "$@" $P > $OUT/b_$S23_NAME.txt 2>&1) & }
c() { (export MLX_PTX_CACHE_DIR=/tmp/ptx_$1 S23_NAME=$1; shift; env "$@" $C "$K" > $OUT/c_$S23_NAME.txt 2>&1) & }
v w1 S23_CACHE=turbo4
v w2 S23_CACHE=turbo4
v wtap S23_TAP=all
v wplain S23_CACHE=plain
v wnosort S23_NOSORT=1
v wclear S23_CLEAR=1
c ci1 S23_X=1
c ci2 S23_X=1
c citap1 S23_TAP=1
c citap2 S23_TAP=1
c citap3 S23_TAP=1
c cioff MLX_LM_TURBO_KERNEL=off
wait
grep -h "^S23" $OUT/*.txt
for f in $OUT/*.txt; do echo "== $f"; grep -E "passed|failed|Error|error" $f | cut -c1-200 | tail -n 3; done
date -u
