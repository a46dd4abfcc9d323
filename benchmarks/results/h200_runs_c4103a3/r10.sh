# session 27, round 2: b4a5294 against the head, alternating processes (SmolLM2, 8K), the
# processes pinned to the GPU's NUMA node's CPUs; then the 8-layer decode stack; then the
# launch bounds at 128K
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
mkdir -p /tmp/smol && cat /tmp/p1 /tmp/p2 /tmp/p3 > /tmp/smol/model.safetensors && cp /tmp/smoljson/*.json /tmp/smol/
BUS=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | tr 'A-F' 'a-f' | sed 's/^0000//')
NODE=$(cat /sys/bus/pci/devices/$BUS/numa_node 2>/dev/null || echo -1)
CPUS=$(cat /sys/devices/system/node/node$NODE/cpulist 2>/dev/null || echo 0-$(($(nproc) - 1)))
{ echo "gpu $BUS numa node $NODE cpus $CPUS"; lscpu | grep -i "model name\|numa\|^cpu(s)\|mhz"; } | tee $OUT/host.txt
git log -1 --format='%h' | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
timeout 330 taskset -c $CPUS python benchmarks/ab_packages.py --versions devrun/old installed --rounds 5 -- \
  --model /tmp/smol --context 8000 --steps 64 --caches fp16 turbo4 2>&1 | tee $OUT/ab.txt | tail -n 18
date -u
timeout 70 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 4096 32768 131072 \
  --schemes turbo4 --out $OUT/decode_attention.md > $OUT/da.txt 2>&1; tail -n 8 $OUT/da.txt
date -u
timeout 150 python benchmarks/decode_kernel_sweep.py --contexts 131072 --warps 4 --targets 512 660 1024 \
  --warps-per-sm 16 20 > $OUT/sweep.txt 2>&1; tail -n 14 $OUT/sweep.txt
date -u
