# session 26, round 1 (b4a5294): the simd kernel's tests on the GPU with 377f304's fixes, and
# the host profile of SmolLM2's pipelined decode at 8K at HEAD
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
pip install -q --no-index /tmp/pyspy_whl/*.whl || exit 1
mkdir -p /tmp/smol && cat /tmp/p1 .smol2/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
git log -1 --format='%h %s' | tee -a $OUT/device.txt; git status --short | grep -v "^??" | tee -a $OUT/device.txt; date -u | tee -a $OUT/device.txt
T="timeout 300 python -m pytest -q -p no:cacheprovider -rfE"
for i in 0 1 2 3; do (MLX_PTX_CACHE_DIR=/tmp/ps$i $T $(cat devrun/simd_part_0$i) > $OUT/simd_$i.txt 2>&1) & done
wait
for f in $OUT/simd_?.txt; do echo "$f: $(tail -n 1 $f)"; grep -m 5 "^FAILED\|^ERROR" $f; done
date -u
for c in fp16 turbo4; do
  timeout 100 py-spy record --native --rate 50 --format raw --output $OUT/pyspy_$c.txt -- \
    python benchmarks/decode_host_profile.py --model /tmp/smol --cache $c --context 8000 --seconds 10 2>&1 | grep -v "behind in sampling\|^py-spy> You\|^$\|transformers"
done
python benchmarks/decode_host_profile.py --summarize $OUT/pyspy_fp16.txt $OUT/pyspy_turbo4.txt --top 40 > $OUT/pyspy_summary.md
gzip $OUT/pyspy_*.txt
date -u
