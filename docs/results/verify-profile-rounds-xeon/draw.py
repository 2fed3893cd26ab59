"""One fresh process, one profile as 4adc1f8 drew it: a single symmetric round (appended to the file given)."""

import json
import sys
import time

import torch

from hf_cascade import measure
from hf_cascade.models import load_default_target

torch.set_num_threads(1)
out = sys.argv[1]
model, tok = load_default_target()
model.eval()
t = time.perf_counter()
cost = measure.measure_verify_cost(model, prompt_len=32, steps=3, repeats=1, grid=measure.QUICK_GRID)
rec = {
    "kind": "old",
    "measure_s": round(time.perf_counter() - t, 1),
    "relative": {n: round(cost(n), 3) for n in measure.QUICK_GRID},
    "time": time.strftime("%H:%M:%S"),
}
print(json.dumps(rec))
open(out, "a").write(json.dumps(rec) + "\n")
