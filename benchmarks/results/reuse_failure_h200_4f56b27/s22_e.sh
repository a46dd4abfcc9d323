# the reuse test with mlx-lm's own caches (no TurboQuant): after the earlier sliding test,
# alone, and after the whole failing selection
source devrun/install-venv.sh > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
date -u
python - <<'PY'
src = open("tests/test_chunk_invariance.py").read()
anchor = "        got = run(model, PROMPT[shared:], reused, 2048)\n"
src = src.replace(anchor, anchor + '        print("CI", shared, got[0], cold[0], (got[1] - cold[1]).abs().max().item(), flush=True)\n')
start = src.index("def test_a_sliding_window_cache_reused_or_reloaded_equals_a_cold_one")
end = src.index("\n\n\n", start)
body = src[start:end]
target = 'make_prompt_cache(model, "turbo4", boundary_skip=0)'
assert body.count(target) == 2
body = body.replace(target, "_cache_for(model)")
src = src[:start] + body + src[end:]
src += '''

def _cache_for(model):
    import os
    if os.environ.get("S22_PLAIN"):
        from mlx_lm.models.cache import make_prompt_cache as plain
        print("S22 plain cache", flush=True)
        return plain(model)
    return make_prompt_cache(model, "turbo4", boundary_skip=0)
'''
open("tests/test_s22_ci.py", "w").write(src)
PY
P="timeout 300 python -m pytest -q -s -p no:cacheprovider --tb=line tests/test_s22_ci.py"
(export MLX_PTX_CACHE_DIR=/tmp/p1 S22_PLAIN=1; $P -k "sliding_window_models and gpt_oss or reused_or_reloaded" > $OUT/e_plain_after_gpt_oss.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/p2 S22_PLAIN=1; $P -k "sliding_window_models or reused_or_reloaded" > $OUT/e_plain_sel_b.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/p3 S22_PLAIN=1; $P -k "reused_or_reloaded" > $OUT/e_plain_alone.txt 2>&1) &
(export MLX_PTX_CACHE_DIR=/tmp/p4 PYTHONPATH=$PWD/devrun S22_GATHER_CHECK=1; $P -p s22_plugin -k "sliding_window_models and gpt_oss or reused_or_reloaded" > $OUT/e_turbo_gather_check.txt 2>&1) &
wait
for f in $OUT/*.txt; do echo "== $f"; grep -E "S22 GATHER|CI |FAILED|Error|passed|failed" $f | cut -c1-200 | head -n 12; done
date -u
