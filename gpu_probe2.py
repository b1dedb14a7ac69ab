"""One-off probe (not committed): is the overhead part's engine figure an order effect?"""
import dataclasses, json, sys, tempfile, time
from pathlib import Path
from bench.gpu_parts import PartRecord, part_overhead, plain_loop, engine_loop, _with_precision, _free
from liveput.models.jobs import resolve_job

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
model = sys.argv[2] if len(sys.argv) > 2 else "gpt2-small"
quick = model != "gpt2-small"
with tempfile.TemporaryDirectory() as d:
    record = PartRecord(Path(d) / "overhead.json")
    t = time.time(); part_overhead(record, device, quick); print("part_overhead", round(time.time() - t, 1), "s")
    print(json.dumps({k: v for k, v in record.data.items() if "ratio" in k or "per_s" in k}))
job = _with_precision(resolve_job(model), "bf16")
whole = dataclasses.replace(job, micro_batch_size=job.global_batch_size)
for round_ in range(3):
    with tempfile.TemporaryDirectory() as d:
        e = engine_loop(whole, device, 15, d)
    _free(device)
    p = plain_loop(job, device, 15)
    _free(device)
    print(f"round {round_}: engine-whole {e*1e3:.1f} ms, plain {p*1e3:.1f} ms, ratio {p/e:.3f}", flush=True)
