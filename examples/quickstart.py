"""Quickstart: faster greedy generate() on the default model, same output (run: python examples/quickstart.py)."""

import hf_cascade
from hf_cascade.models import load_default_target

model, tok = load_default_target()  # Gemma-3-270M from PyPI packages, converted and cached on first use
ids = tok("def fibonacci(n):\n", return_tensors="pt").input_ids
out = model.generate(ids, assistant_model=hf_cascade.CascadeAssistant([hf_cascade.MaxGram()]), max_new_tokens=64)
print(tok.decode(out[0], skip_special_tokens=True))
