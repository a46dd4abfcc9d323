# issue 9, session 34: v1 (be38a50) against v3 (v1 + 4-bit keys by shuffles), kernel alone at 128K; the winner's GPU tests, stack and ncu profile
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
T=$OUT/kernel_times.txt; : > $T
kt() {  # variant caches...
  v=$1; shift
  echo "== $v $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 150 python benchmarks/kernel_times.py --caches "$@" --contexts 131072 >> $T 2>&1 || echo "rc $?" >> $T
}
kt v1 fp16 turbo4 turbo4v2 turbo5v3
kt v3 turbo4 turbo4v2 turbo5v3
echo "== end $(date -u +%T)" >> $T
grep "==\|turbo_decode\|cudnn_generated\|rc " $T
us() { awk -v v="$1" -v c="$2" '/^== /{cur=$2} cur==v && $2==c && /turbo_decode/ {print $(NF-1)}' $T | head -1; }
a=$(us v1 turbo4); b=$(us v3 turbo4); echo "v1 $a v3 $b"
W=v1; if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN{exit !(b < a)}'; then W=v3; fi
echo "winner $W" | tee $OUT/winner.txt
cp devrun/variants/$W/mlx_lm_turbo/kernels/decode_attention.cu mlx_lm_turbo/kernels/decode_attention.cu
set -o pipefail
[ $W = v3 ] && timeout 200 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "every_width or staging or batch_rows or long_context or (head_dims and float16)" 2>&1 | tee $OUT/tests_kernels.txt | tail -n 4
date -u +%T
PYTHONPATH=devrun/variants/$W timeout 150 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
  --contexts 4096 32768 131072 --schemes turbo4 turbo3 turbo2 turbo4v2 turbo5v3 --out $OUT/stack_$W.md > $OUT/stack_$W.txt 2>&1; echo rc $?
grep "^| " $OUT/stack_$W.txt | cut -d'|' -f2-6,11-12; date -u +%T
if grep -q H200 $OUT/gpu.txt; then
  PYTHONPATH=devrun/variants/base timeout 100 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 \
    --contexts 4096 32768 131072 --schemes turbo4 --out $OUT/stack_base.md > $OUT/stack_base.txt 2>&1; echo rc $?
  grep "^| " $OUT/stack_base.txt | cut -d'|' -f2-6,11-12; date -u +%T
fi
