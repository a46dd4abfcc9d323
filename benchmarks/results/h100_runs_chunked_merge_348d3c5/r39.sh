# issue 9, next session: variant/chunked-merge (bd837b5: parts merged by chunks of 16, then the chunks; MAX_SLICES 1023) against main: the kernel alone at Gemma's attention shape (one KV head), SmolLM2's (3 KV heads, head dim 64) and the issue's; its GPU kernel tests; the stack at Gemma's shape
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
T=$OUT/kernel_times.txt; : > $T
kt() {  # variant extra-args caches...
  v=$1; x=$2; shift 2
  echo "== $v $x $(date -u +%T)" >> $T
  PYTHONPATH=devrun/variants/$v timeout 120 python benchmarks/kernel_times.py $x --caches "$@" >> $T 2>&1 || echo "rc $?" >> $T
}
kt main "--heads 4 1 256 --contexts 32768 131072" turbo4
kt chunk "--heads 4 1 256 --contexts 32768 131072 --max-slices 255" turbo4
kt chunk "--heads 4 1 256 --contexts 32768 131072" turbo4
kt main "--heads 9 3 64 --contexts 8192 32768" turbo4
kt chunk "--heads 9 3 64 --contexts 8192 32768" turbo4
kt main "--contexts 131072" turbo4 turbo3
kt chunk "--contexts 131072" turbo4 turbo3
echo "== end $(date -u +%T)" >> $T
grep "==\|turbo_decode\|rc " $T
set -o pipefail
rm -rf /tmp/t_chunk && mkdir -p /tmp/t_chunk && cp -r devrun/variants/chunk/tests devrun/variants/chunk/mlx_lm_turbo pyproject.toml /tmp/t_chunk/
(cd /tmp/t_chunk && timeout 200 python -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels.py \
  -k "many_slices or long_context or every_width or gqa or verify_steps or sinks or batch_rows" 2>&1 | tail -n 8 | tee $OUT/tests_kernels_chunk.txt)
for v in main chunk; do
  PYTHONPATH=devrun/variants/$v timeout 60 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --q-heads 4 --kv-heads 1 --head-dim 256 \
    --contexts 32768 131072 --schemes turbo4 --out $OUT/stack_d256_$v.md > /dev/null 2>&1; echo "stack $v rc $?"
  grep "^| " $OUT/stack_d256_$v.md | cut -d'|' -f2-6,11-12
done; date -u +%T
