"""Where a batch-1 decode step's time goes on the GPU (not part of the check; a one-off probe).

Wall per step (engine generate, prefill cancelled) vs the decode graph's replay alone vs the
kernels a profiler sees per step. Writes JSON and the profiler's table to the folder given."""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_speed import _timed  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
res = {}
llm = LLM(
    model="llama-3.2-1b",
    load_format="dummy",
    device="cuda",
    dtype="bfloat16",
    num_blocks=256,
    max_model_len=512,
    max_num_seqs=1,
    enable_prefix_caching=False,
)
prompt = [{"prompt_token_ids": list(range(3, 131))}]
run = lambda n: llm.generate(prompt, SamplingParams(max_tokens=n, ignore_eos=True, temperature=0))
run(2)
t1 = _timed(lambda: run(1), "cuda", 3)
tn = _timed(lambda: run(129), "cuda", 3)
res["wall_ms_per_step"] = (tn - t1) / 128 * 1e3
graphs = llm.engine.runner.graphs
g, _ = graphs.graphs[1]
g.replay()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(200):
    g.replay()
torch.cuda.synchronize()
res["graph_replay_ms"] = (time.perf_counter() - t0) / 200 * 1e3
from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    run(33)
    torch.cuda.synchronize()
ka = prof.key_averages()
(out_dir / "profile-b1-cuda.txt").write_text(ka.table(sort_by="cuda_time_total", row_limit=40))
(out_dir / "profile-b1-cpu.txt").write_text(ka.table(sort_by="cpu_time_total", row_limit=60))
res["kernels"] = sorted(
    ((e.key, e.count, e.device_time_total / 1e3) for e in ka if e.device_time_total > 0),
    key=lambda r: -r[2],
)[:40]
print(json.dumps({k: v for k, v in res.items() if k != "kernels"}))
(out_dir / "profile-b1.json").write_text(json.dumps(res, indent=1))
llm.shutdown()
