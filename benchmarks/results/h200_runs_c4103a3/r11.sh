# session 27, round 2: which stored rows differ on the GPU (diag_rows.py), per variant
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
export MLX_PTX_CACHE_DIR=/tmp/ptx_diag
P="timeout 100 python devrun/diag_rows.py"
$P plain turbo4 128 32 6 2>&1 | tail -n 1
$P all_rows turbo4 128 32 6 2>&1 | tail -n 1
$P eval turbo4 128 32 6 2>&1 | tail -n 1
$P plain turbo4 128 32 4 2>&1 | tail -n 1
$P plain turbo4 128 16 6 2>&1 | tail -n 1
$P plain turbo4 128 1 6 2>&1 | tail -n 1
MLX_USE_CUDA_GRAPHS=0 $P plain turbo4 128 32 6 2>&1 | tail -n 1
$P plain turbo2 256 32 6 2>&1 | tail -n 1
date -u
