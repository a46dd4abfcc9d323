# the failing selection of test_chunk_invariance.py: recorded; counters out of the small
# pool; a synchronize after the cold run; the reuse test alone
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u
python - <<'PY'
src = open("tests/test_chunk_invariance.py").read()
anchor = "        got = run(model, PROMPT[shared:], reused, 2048)\n"
assert src.count(anchor) == 1
new = '''        import s22_plugin
        record = shared == 40 and not s22_plugin.CALLS and os.environ.get("S22_REC")
        s22_plugin.ACTIVE[0] = bool(record)
        got = run(model, PROMPT[shared:], reused, 2048)
        s22_plugin.ACTIVE[0] = False
        if record:
            s22_plugin.save()
        print("CI", shared, got[0], cold[0], (got[1] - cold[1]).abs().max().item(), flush=True)
'''
src = src.replace(anchor, new)
old = '    cold = run(model, PROMPT, make_prompt_cache(model, "turbo4", boundary_skip=0), 2048)\n'
assert src.count(old) == 1
src = src.replace(old, old + '    if os.environ.get("S22_SYNC"):\n        mx.synchronize()\n')
open("tests/test_s22_ci.py", "w").write("import os\n" + src)
PY
export PYTHONPATH=$PWD/devrun
P="timeout 330 python -m pytest -q -s -p no:cacheprovider -p s22_plugin --tb=line tests/test_s22_ci.py"
K="sliding_window_models or reused_or_reloaded"
(export MLX_PTX_CACHE_DIR=/tmp/p1 S22_REC=$OUT/dump_fail.npz; $P -k "$K" > $OUT/b_rec.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/p2 S22_COUNTERS16=1; $P -k "$K" > $OUT/b_counters16.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/p3 S22_SYNC=1; $P -k "$K" > $OUT/b_sync.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/p4; $P -k "reused_or_reloaded" > $OUT/reuse_alone.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/p5; $P -k "$K" > $OUT/b_control.txt 2>&1) &
wait
for f in $OUT/*.txt; do echo "== $f"; grep -E "S22|CI |FAILED|Error|passed|failed" $f | cut -c1-200 | tail -n 8; done
date -u
