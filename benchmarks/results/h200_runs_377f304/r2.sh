# session 25, round 2: kernel sources #included (MLX-CUDA hashes the source at every call):
# GPU tests of the kernels, then the SmolLM2 8K decode split before (5749ec2, PYTHONPATH copy)
# and after, and the 8-layer decode stack
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/p1 .smol2/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
git log -1 --format='%h %s' | tee -a $OUT/device.txt; git status --short | head -20 | tee -a $OUT/device.txt; date -u | tee -a $OUT/device.txt
T="timeout 240 python -m pytest -q -p no:cacheprovider"
(MLX_PTX_CACHE_DIR=/tmp/ptx1 $T tests/test_kernels.py -k "not window and not recent" > $OUT/t1.txt 2>&1) &
(MLX_PTX_CACHE_DIR=/tmp/ptx2 $T tests/test_kernels.py -k "window or recent" > $OUT/t2.txt 2>&1) &
(MLX_PTX_CACHE_DIR=/tmp/ptx3 $T tests/test_recent_exact.py > $OUT/t3.txt 2>&1) &
(MLX_PTX_CACHE_DIR=/tmp/ptx4 $T tests/test_kernel_simd.py > $OUT/t4.txt 2>&1) &
wait
for f in $OUT/t?.txt; do echo "$f: $(tail -n 1 $f)"; grep -m 5 "^FAILED\|^ERROR" $f; done
date -u
S="timeout 100 python benchmarks/decode_step_split.py --model /tmp/smol --context 8000 --steps 64 --rounds 3 --caches fp16 turbo4"
PYTHONPATH=$PWD/devrun/old $S --out $OUT/split_old.md > /tmp/so.txt 2>&1; echo old; tail -n 2 /tmp/so.txt
$S --out $OUT/split_new.md > /tmp/sn.txt 2>&1; echo new; tail -n 2 /tmp/sn.txt
date -u
timeout 110 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 32768 131072 \
  --schemes turbo4 --out $OUT/decode_attention.md > /tmp/da.txt 2>&1; tail -n 8 /tmp/da.txt
date -u
