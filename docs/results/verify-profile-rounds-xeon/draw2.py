import json
import sys
import time

import torch

from hf_cascade import measure
from hf_cascade.models import load_default_target

torch.set_num_threads(1)
model, tok = load_default_target()
model.eval()
t = time.perf_counter()
measure.measured_verify_cost(model)
p = measure.measured_profiles()[0]
rec = {
    "time": time.strftime("%H:%M:%S"),
    "measure_s": round(time.perf_counter() - t, 1),
    "rounds": p["rounds"],
    "relative": p["relative"],
}
print(json.dumps(rec))
open(sys.argv[1], "a").write(json.dumps(rec) + "\n")
