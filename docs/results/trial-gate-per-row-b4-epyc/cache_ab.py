"""Decoder forward at 1/4 rows: DynamicCache (cat per step) vs a layer growing in place; prefix 800."""
import time, torch, statistics
import hf_cascade
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from hf_cascade.models import load_default_target
torch.set_num_threads(2)

class GrowingLayer(DynamicLayer):
    _kb = _vb = None
    def update(self, k, v, *a, **kw):
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        n = self.keys.shape[-2] if self.keys.numel() else 0
        need = n + k.shape[-2]
        kb = self._kb
        if (kb is None or need > kb.shape[-2] or kb.shape[:2] != k.shape[:2]
                or (n and self.keys.data_ptr() != kb.data_ptr())):
            cap = max(256, 2 * need)
            nk, nv = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3]), v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])
            if n:
                nk[:, :, :n], nv[:, :, :n] = self.keys, self.values
            self._kb, self._vb = nk, nv
        self._kb[:, :, n:need], self._vb[:, :, n:need] = k, v
        self.keys, self.values = self._kb[:, :, :need], self._vb[:, :, :need]
        return self.keys, self.values

def growing():
    c = DynamicCache(); c.layer_class_to_replicate = GrowingLayer; return c

model, tok = load_default_target()
dec = model.get_decoder()
ids = torch.randint(1000, 5000, (1, 800))
res = {}
with hf_cascade.cpu_kernels(model), torch.no_grad():
    caches = {"dynamic": DynamicCache(), "growing": growing()}
    for c in caches.values():
        dec(input_ids=ids, past_key_values=c, use_cache=True)
    for rows in (1, 4, 1, 4):
        q = torch.randint(1000, 5000, (1, rows))
        ts = {k: [] for k in caches}
        outs = {}
        for i in range(16):
            for name, c in (caches.items() if i % 2 else reversed(caches.items())):
                t = time.perf_counter()
                h = dec(input_ids=q, past_key_values=c, use_cache=True).last_hidden_state
                ts[name].append(time.perf_counter() - t)
                outs[name] = h
                c.crop(-rows)
        print(rows, {k: round(1000 * statistics.median(v[4:]), 2) for k, v in ts.items()},
              "same" if torch.equal(outs["dynamic"], outs["growing"]) else "DIFF")
