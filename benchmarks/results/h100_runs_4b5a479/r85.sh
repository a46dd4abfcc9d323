# session 47 (main 4b5a479): PAIR_COPIES now in the kernel's header (4d1a427): the kernel tests of every width and the dynamic layout through MLX's JIT, then turbo4's 128K stack once
source .dev2/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; date -u +%T
timeout 170 python -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "every_width or dynamic or two_bit_values" > $OUT/r85_tests.txt 2>&1; echo "tests rc $?"; tail -n 3 $OUT/r85_tests.txt; date -u +%T
timeout 60 python benchmarks/decode_attention.py --prefill 0 --steps 16 --rounds 3 --contexts 131072 --schemes turbo4 --out $OUT/r85_w128.md > /dev/null 2>&1; echo "128K rc $?"
grep "^| " $OUT/r85_w128.md | cut -d'|' -f2-6; date -u +%T
