"""Bucket acceptance of corpus drafts on held-out distillation records (training data, not Spec-Bench)."""
import zlib
from collections import defaultdict
from hf_cascade import CorpusNGrams
from hf_cascade.drafters.maxgram import _suffix_match
from hf_cascade.training.store import DistillStore
store = DistillStore.open("/work/kd/mix2")
held = [i for i, r in enumerate(store.records) if zlib.crc32(r.id.encode()) % 20 == 0]
train = [i for i in range(len(store)) if i not in set(held)]
corpus = CorpusNGrams.fit((store.sequence(i) for i in train), 262144, max_n=4, min_count=2)
b = defaultdict(lambda: [0, 0])
for i in held:
    ids, start = store.sequence(i); seq = ids.tolist()
    for t in range(start, len(seq)):
        m, _ = _suffix_match(seq[:t], 10)
        if m >= 3: continue
        chain, first = corpus.chain(seq[:t], 10, 0.3)
        if first is None: continue
        n = 0
        while n < len(chain) and t + n < len(seq) and chain[n] == seq[t + n]: n += 1
        x = b[first.bucket]; x[0] += n; x[1] += n + (1 if n < len(chain) else 0)   # per-token acceptance as AdaptiveLookahead counts it
print(len(held), "held-out records")
for k in sorted(b): print(k, b[k][1], "per-token acceptance %.2f" % (b[k][0] / b[k][1]))
