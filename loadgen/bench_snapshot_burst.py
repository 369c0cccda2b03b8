"""Snapshot reads during a cold burst (issue 26.7): the worst latency of `latest_snapshot_bytes()`
(what /api/kv and the dashboard read) while 8 cold ~450-token prompts are prefilled in one step,
with readers waiting for the engine's step boundary (max_wait_s huge: the old behaviour) and with
the shared snapshot's bounded wait (0.2 s), alternated in one process.

    PYTHONPATH=. python loadgen/bench_snapshot_burst.py
"""

import threading
import time
from engine import ServingLLM, SamplingParams


def main():
    llm = ServingLLM(num_blocks=1200, max_num_batched_tokens=8192, max_model_len=2048, device="cpu")
    llm.latest_snapshot()
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()

    def burst(tag, wait):
        llm.set_snapshot_wait(wait)
        prompts = [
            " ".join(f"{words[(i * 7 + k) % 12]}{tag}{i}-{k}" for k in range(150)) for i in range(8)
        ]
        streams = [llm.submit(p, SamplingParams(max_tokens=2, temperature=0.0)) for p in prompts]
        rs = [threading.Thread(target=lambda s=s: list(s)) for s in streams]
        [r.start() for r in rs]
        worst, n, t0 = 0.0, 0, time.monotonic()
        while any(r.is_alive() for r in rs):
            a = time.monotonic()
            llm.latest_snapshot_bytes()
            worst = max(worst, time.monotonic() - a)
            n += 1
            time.sleep(0.05)
        print(
            f"max_wait_s={wait}: burst {time.monotonic() - t0:.1f} s, {n} reads, worst read {worst:.2f} s"
        )

    burst("a", 1e9)  # as before: a reader waits for the engine thread's step boundary
    burst("b", 0.2)  # this branch
    burst("c", 1e9)
    burst("d", 0.2)
    llm.shutdown()


if __name__ == "__main__":
    main()
