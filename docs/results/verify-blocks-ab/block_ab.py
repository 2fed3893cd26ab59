"""In-process A/B of two verification details, on MaxGram(corpus=...) (the shipped corpus n-grams), greedy, 128 tokens:

* the greedy head's block (rows computed per head call up to the first rejection): 4 or 8 rows, as
  ``calibrate_block_rows`` chose at random between processes on the AMD EPYC before it timed medians;
* the panel kernel for more than 8 rows: one full pass over the weight per 8 rows (the kernel of commit 58a4cc6,
  built here from git) or chunks of 8 rows over each cached block of panels (this checkout's kernel).

usage: python docs/results/verify-blocks-ab/block_ab.py TAKE   Spec-Bench prompts FIRST .. FIRST+TAKE-1 of each category
(FIRST, default 3: none of the benchmark's first 3). Arms interleaved per prompt (rotating order), one warm-up each;
paired ratios as in `hf-cascade bench` (hf_cascade.bench.summary.paired)."""
import os, subprocess, sys, tempfile, time
from pathlib import Path
import torch
from torch.utils.cpp_extension import load
import hf_cascade.backends.cpu.panel as panel
import hf_cascade.backends.cpu.verify_head as verify_head
from hf_cascade import CascadeAssistant, CorpusNGrams, MaxGram
from hf_cascade.bench import summary
from hf_cascade.bench.loading import load_model, load_prompts
from hf_cascade.bench.runner import encode, rotated
from hf_cascade.backends.cpu.kernels import shape_key

OLD_COMMIT = "58a4cc6"


def old_kernel():
    """The panel kernel as of OLD_COMMIT (a full pass over the weight per 8 rows), built in a temporary directory."""
    src = subprocess.run(["git", "show", f"{OLD_COMMIT}:hf_cascade/csrc/panel_linear.cpp"], check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "panel_linear_old.cpp"
    path.write_text(src)
    return load(f"hf_cascade_panel_old_{panel.cpu_tag()}", [str(path)], extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"], build_directory=str(path.parent))


def main() -> None:
    take, first = int(sys.argv[1]), int(os.environ.get("FIRST", 3))
    kernels = {"old": old_kernel(), "new": panel.extension()}
    using = [kernels["old"]]
    panel.extension = lambda: using[0]                      # the panel copies are the same layout in both
    model, tok = load_model(None)
    corpus = CorpusNGrams.load("model_cards/gemma-3-270m-corpus-ngrams/corpus.safetensors")
    bycat = {}
    for it in load_prompts(None, first + take):
        bycat.setdefault(it["category"], []).append(it)
    prompts = [it for v in bycat.values() for it in v[first:first + take]]
    head_key = shape_key(model.get_output_embeddings().weight, 1)
    arms = {"b4-old": (4, "old"), "b8-old": (8, "old"), "b8-new": (8, "new")}
    assistants = {n: CascadeAssistant([MaxGram(corpus=corpus)]) for n in arms}

    def use(name):
        verify_head._BLOCK_ROWS[head_key], kernel = arms[name]   # the head's block, as the calibration would set it
        using[0] = kernels[kernel]

    warm = encode(tok, {"prompt": "Question: Hello\n\nAnswer:"})
    for n in arms:
        use(n)
        model.generate(input_ids=warm[0], attention_mask=warm[1], assistant_model=assistants[n], do_sample=False,
                       max_new_tokens=32)
    records, identical = [], 0
    for i, p in enumerate(prompts):
        ids, mask = encode(tok, p)
        outs = set()
        for n in rotated(list(arms), i):
            use(n)
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=mask, assistant_model=assistants[n], do_sample=False,
                                 max_new_tokens=128)
            records.append({"prompt_index": i, "category": p["category"], "method": n,
                            "seconds": time.perf_counter() - t0,
                            "tokens_per_call": assistants[n].last_stats.tokens_per_target_call})
            outs.add(tuple(out[0].tolist()))
        identical += len(outs) == 1
    print(f"{len(prompts)} prompts (FIRST={first}); identical across arms: {identical} / {len(prompts)}")
    print("total s", {n: round(sum(r["seconds"] for r in records if r["method"] == n), 1) for n in arms})
    names = list(arms)
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            pr = summary.paired(records, names[i], names[j])
            print(f"{names[i]} / {names[j]}", round(pr["ratio"], 3), round(pr["low"], 3), round(pr["high"], 3),
                  f"faster on {pr['faster_on']}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
