"""Writes the plans llama.cpp must refuse at context creation (50-llama.sh).

Arguments: as 50-llama.sh passes them ($plan $out).
"""
import json, sys
p = json.load(open(sys.argv[1]))
p.pop("calibration", None)
p["version"] = 1
def write(name, **kw):
    q = dict(p, **kw)
    json.dump(q, open(f"{sys.argv[2]}/{name}.json", "w"))
write("plan-24-layers", layers=p["layers"][:24])
write("plan-4-heads", n_kv_head=4)
write("plan-d128", head_dim=128)
# an f16 window has no block form (version 3's recent_bits makes it kvq rows)
write("plan-f16-window", recent_tokens=16)
# version 3: a K center without an f16 sink
write("plan-center-no-sink", version=3, recent_tokens=64, recent_bits=8, k_center=True)
