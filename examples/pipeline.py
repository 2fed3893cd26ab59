"""hf_cascade inside a transformers pipeline (run: python examples/pipeline.py).

``import hf_cascade`` lets ``pipeline(..., assistant_model=...)`` accept a CascadeAssistant; every call of the
pipeline then drafts with it. Greedy outputs are identical to the pipeline without an assistant.
"""

from transformers import pipeline

import hf_cascade
from hf_cascade.models import load_default_target

model, tokenizer = load_default_target()
assistant = hf_cascade.CascadeAssistant([hf_cascade.MaxGram()])
generator = pipeline("text-generation", model=model, tokenizer=tokenizer, assistant_model=assistant)

prompts = [
    "The planets of the solar system, in order, are Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus and Neptune.\n"
    "In reverse order they are",
    "Question: What are the four stages of the water cycle?\nAnswer:",
]
for prompt in prompts:
    result = generator(prompt, max_new_tokens=48, do_sample=False, return_full_text=False)
    print(prompt + result[0]["generated_text"])
    stats = assistant.last_stats
    print(f"[{stats.tokens_per_target_call:.2f} tokens per target call]\n")
