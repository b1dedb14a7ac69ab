"""One-off probe (not committed): where the engine's step goes on the GPU."""
import dataclasses, logging, sys, tempfile, time
import torch
from bench.gpu_parts import plain_loop, engine_loop, _with_precision
from liveput.models.jobs import resolve_job

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
model = sys.argv[2] if len(sys.argv) > 2 else "gpt2-small"
job = _with_precision(resolve_job(model), "bf16")
whole = dataclasses.replace(job, micro_batch_size=job.global_batch_size)
print("clip", job.training.clip_grad_norm if hasattr(job.training, "clip_grad_norm") else "?", "micro", job.num_micro_batches, flush=True)
plain = plain_loop(job, device, 20)
print(f"plain {plain*1e3:.1f} ms", flush=True)
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
logging.getLogger("liveput.runtime.engine").setLevel(logging.DEBUG)
with tempfile.TemporaryDirectory() as d:
    eng = engine_loop(whole, device, 12, d)
print(f"engine {eng*1e3:.1f} ms ratio {plain/eng:.3f}", flush=True)
logging.getLogger("liveput.runtime.engine").setLevel(logging.WARNING)
from torch.profiler import profile, ProfilerActivity
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
with tempfile.TemporaryDirectory() as d, profile(activities=acts) as prof:
    engine_loop(whole, device, 6, d)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
with profile(activities=acts) as prof2:
    plain_loop(job, device, 6)
print(prof2.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
