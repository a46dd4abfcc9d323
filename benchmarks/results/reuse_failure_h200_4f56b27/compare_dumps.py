# the reused run's custom-kernel calls, recorded (s22_plugin.py, S22_REC / S22_DUMP) in a
# fresh passing process (s22_a.sh: dump_clean.npz) and in the failing selection
# (s22_b.sh: dump_fail.npz): the first calls whose inputs or outputs differ
import json
import sys

import numpy as np

a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
meta = json.loads(str(b["meta"]))
for i, (name, grid, n_in, n_out) in enumerate(meta):
    for kind, n in (("in", n_in), ("out", n_out)):
        for j in range(n):
            x, y = a[f"{i}_{kind}{j}"], b[f"{i}_{kind}{j}"]
            if x.tobytes() != y.tobytes():
                d = (
                    np.abs(x.astype(float) - y.astype(float)).max()
                    if x.dtype.kind == "f"
                    else (x != y).mean()
                )
                print(i, name, kind, j, x.shape, x.dtype, d)
