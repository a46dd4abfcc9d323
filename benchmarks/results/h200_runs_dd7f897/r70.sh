# issue 9, session 44 (main dd7f897) on the H200: GPU tests of the kernel changes since 0f6aa88 (faa4d96 tile copies, 274eddb clear tile, e640d13 empty rows), of lp32 (the 4-bit table once a bank, in dynamic shared memory) and of buf2 (two staging buffers there), then the 8-layer stack at 128K: 0f6aa88, the head, lp32 and buf2 taking turns
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
K="every_width or head_dims_and_dtypes or more_than_eight or many_slices or verify_steps_of_other or sinks or recent or window or raw"
timeout 140 python -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels.py -k "$K" 2>&1 | tail -n 8 | tee $OUT/tests_head.txt; date -u +%T
(cd devrun/v_lp32 && PYTHONPATH=. timeout 140 python -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels.py -k "$K or staging or dynamic" 2>&1 | tail -n 8) | tee $OUT/tests_lp32.txt; date -u +%T
(cd devrun/v_buf2 && PYTHONPATH=. timeout 60 python -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels.py -k "head_dims_and_dtypes or many_slices or staging" 2>&1 | tail -n 8) | tee $OUT/tests_buf2.txt; date -u +%T
S="--prefill 0 --steps 16 --rounds 3"
for i in 1 2; do
 for t in devrun/t_0f6aa88 . devrun/v_lp32 devrun/v_buf2; do
  n=$(basename $(realpath $t))
  (cd $t && PYTHONPATH=. timeout 40 python benchmarks/decode_attention.py $S --contexts 131072 --schemes turbo4 > $OUT/stack128_${i}_$n.txt 2>&1; echo "$n rc $?")
  grep "^| turbo4\|^| fp16" $OUT/stack128_${i}_$n.txt | head -4 | cut -d'|' -f2-6
 done
done; date -u +%T
