# the reuse tests alone ([10] then [40]) with every op of the first MLP block of the [40]
# prefix compared against the CPU (S23_TAP=moe), four times; and with the kernels off, with CUDA graphs off too, or compile off too; the first down projection recomputed on the GPU

source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u
python devrun/s23_make_ci.py
export PYTHONPATH=$PWD/devrun
C="timeout 330 python -m pytest -q -s -p no:cacheprovider --tb=line tests/test_s23_ci.py -k"
K="sliding_window_models and gpt_oss or reused_or_reloaded"
c() { (export MLX_PTX_CACHE_DIR=/tmp/ptx_$1 S23_NAME=$1; k=$2; shift 2; env "$@" $C "$k" > $OUT/e_$S23_NAME.txt 2>&1) & }
for i in 1 2 3 4; do c moe$i "reused_or_reloaded" S23_TAP=moe; done
for i in 1 2; do c off$i "reused_or_reloaded" S23_TAP=moe MLX_LM_TURBO_KERNEL=off; c nograph$i "reused_or_reloaded" S23_TAP=moe MLX_LM_TURBO_KERNEL=off MLX_USE_CUDA_GRAPHS=0; c nocompile$i "reused_or_reloaded" S23_TAP=moe MLX_LM_TURBO_KERNEL=off MLX_DISABLE_COMPILE=1; done

wait
for f in $OUT/*.txt; do echo "== $f"; grep -h "S23\|passed\|failed" $f | cut -c1-700; done > $OUT/summary.log
cat $OUT/summary.log
date -u
