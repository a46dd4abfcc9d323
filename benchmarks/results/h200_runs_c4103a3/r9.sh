# session 27, round 1: the GPU tests of the kernels at the tree's head (7c2a5aa's in-place
# row, f76010b's per-thread workspace, daff5e1's tail_row), beside needles on SmolLM2 at 8K
# with the passphrase's log-probability (fp16 turbo4 | fp16 turbo5v3 turbo4v2)
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/p1 /tmp/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader | tee $OUT/device.txt
git log -1 --format='%h %s' | tee -a $OUT/device.txt; date -u | tee -a $OUT/device.txt
T="timeout 400 python -m pytest -q -p no:cacheprovider -rfE"
for i in 0 1 2 3; do (MLX_PTX_CACHE_DIR=/tmp/pk$i $T $(cat devrun/k_part_0$i) > $OUT/k_$i.txt 2>&1) & done
(MLX_PTX_CACHE_DIR=/tmp/pr $T tests/test_recent_exact.py > $OUT/recent.txt 2>&1) &
B="timeout 480 mlx-lm-turbo bench --memory-context 0 --no-speed --decode 16 --contexts 512 --needle-trials 4 --model /tmp/smol --needle-contexts 8000 --needle-depths 0.1 0.3 0.5 0.7 0.9"
(mkdir -p /tmp/n1 && cd /tmp/n1 && MLX_PTX_CACHE_DIR=/tmp/ptx_n1 $B --caches fp16 turbo4 --out /tmp/n1 > $OUT/n1.txt 2>&1; cp /tmp/n1/results.json $OUT/needles_fp16_turbo4.json) &
(mkdir -p /tmp/n2 && cd /tmp/n2 && MLX_PTX_CACHE_DIR=/tmp/ptx_n2 $B --caches fp16 turbo5v3 turbo4v2 --out /tmp/n2 > $OUT/n2.txt 2>&1; cp /tmp/n2/results.json $OUT/needles_turbo5v3_turbo4v2.json) &
wait
for f in $OUT/k_?.txt $OUT/recent.txt; do echo "$f: $(tail -n 1 $f)"; grep -m 5 "^FAILED\|^ERROR" $f; done
grep -h "^| " $OUT/n1.txt $OUT/n2.txt
date -u
