"""One fresh process: 6 symmetric rounds of the default profile's measurement after a warm-up round; append each
round's ratios to the file given (the noise between rounds)."""

import json
import sys
import time

import torch

from hf_cascade import measure
from hf_cascade.models import load_default_target

torch.set_num_threads(1)
model, tok = load_default_target()
model.eval()
rows = measure._rounds(
    model,
    rounds=6,
    grid=measure.QUICK_GRID,
    steps=measure.QUICK_SETTINGS["steps"],
    prompt_len=measure.QUICK_SETTINGS["prompt_len"],
)
rows = [{n: round(r[n], 3) for n in r} for r in rows]
for r in rows:
    print(json.dumps(r))
open(sys.argv[1], "a").write(json.dumps({"time": time.strftime("%H:%M:%S"), "rounds": rows}) + "\n")
