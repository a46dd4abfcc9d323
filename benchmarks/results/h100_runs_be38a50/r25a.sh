# issue 9, session 34: base (dba72d3) / v1 (HEAD be38a50) / v2 (v1 + 4-bit value pair table), kernel alone at 128K, then GPU tests of the winner
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
mkdir -p devrun/variants/v1 && cp -r mlx_lm_turbo devrun/variants/v1/
T=$OUT/kernel_times.txt; : > $T
kt() {  # variant caches...
  v=$1; shift
  echo "== $v $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 150 python benchmarks/kernel_times.py --caches "$@" --contexts 131072 >> $T 2>&1 || echo "rc $?" >> $T
}
kt base fp16 turbo4 turbo4v2
kt v1 turbo4 turbo4v2 turbo3
kt v2 turbo4 turbo0v4
echo "== end $(date -u +%T)" >> $T
grep "==\|turbo_decode\|cudnn_generated\|rc " $T
us() { awk -v v="$1" -v c="$2" '/^== /{cur=$2} cur==v && $2==c && /turbo_decode/ {print $(NF-1)}' $T | head -1; }
a=$(us v1 turbo4); b=$(us v2 turbo4); echo "v1 $a v2 $b"
W=v1; if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN{exit !(b < a)}'; then W=v2; fi
echo $W > /tmp/winner; echo "winner $W" | tee $OUT/winner.txt
cp devrun/variants/$W/mlx_lm_turbo/kernels/decode_attention.cu mlx_lm_turbo/kernels/decode_attention.cu
set -o pipefail
timeout 240 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "every_width or staging or batch_rows or long_context or (head_dims and float16)" 2>&1 | tee $OUT/tests_kernels.txt | tail -n 5
date -u +%T
