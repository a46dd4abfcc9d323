# issue 9, session 44 after r70.sh: buf2's GPU tests (the -k set of r70, all of it), then each kernel alone at 128K (ncu): the head and buf2
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
K="every_width or head_dims_and_dtypes or more_than_eight or many_slices or verify_steps_of_other or sinks or recent or window or raw or staging or dynamic"
(cd devrun/v_buf2 && PYTHONPATH=. timeout 280 python -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels.py -k "$K" 2>&1 | tail -n 8) | tee $OUT/tests_buf2.txt; date -u +%T
for t in . devrun/v_buf2; do
  n=$(basename $(realpath $t))
  (cd $t && PYTHONPATH=. timeout 70 python benchmarks/kernel_times.py --caches fp16 turbo4 --contexts 131072 > $OUT/kernel_times_$n.txt 2>&1; echo "$t rc $?")
  grep "turbo_decode\|cudnn_generated" $OUT/kernel_times_$n.txt | cut -c1-120; date -u +%T
done
