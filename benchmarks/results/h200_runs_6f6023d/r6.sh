# session 26, round 2: what a custom-kernel call's inputs, outputs and named shapes cost the host
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
git log -1 --format='%h' | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
for i in 1 2; do timeout 200 python benchmarks/custom_call_cost.py --rounds 5 --steps 200 | tee $OUT/custom_call_cost_$i.txt; done
date -u
