# tests/test_s23_ci.py: test_chunk_invariance.py with the reuse test's prefix compared
# against the same prefix computed on the CPU (devrun/s23_taps.py), nothing else changed
src = open("tests/test_chunk_invariance.py").read()
old = """    prefix = make_prompt_cache(model, "turbo4", boundary_skip=0)
    model(mx.array([PROMPT[:shared]]), cache=prefix)
    save_prompt_cache(str(tmp_path / "prefix.safetensors"), prefix)
"""
new = """    import numpy as np
    import s23_taps

    prefix = make_prompt_cache(model, "turbo4", boundary_skip=0)
    s23_taps.TAPS.clear()
    s23_taps.RECORD[0] = True
    model(mx.array([PROMPT[:shared]]), cache=prefix)
    s23_taps.RECORD[0] = False
    save_prompt_cache(str(tmp_path / "prefix.safetensors"), prefix)
    gpu_taps = [np.array(t) for t in s23_taps.TAPS + s23_taps.MOE_TAPS]
    s23_taps.TAPS.clear()
    s23_taps.MOE_TAPS.clear()
    s23_taps.compare(
        model,
        lambda: make_prompt_cache(model, "turbo4", boundary_skip=0),
        PROMPT[:shared],
        str(tmp_path / "prefix.safetensors"),
        tmp_path,
        gpu_taps,
    )
"""
assert src.count(old) == 1
open("tests/test_s23_ci.py", "w").write(src.replace(old, new))
