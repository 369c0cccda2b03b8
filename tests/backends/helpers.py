"""Helpers several backend tests share: the two recorded vLLM KV-event streams and how to replay
them through a Feed, and scripted /metrics texts. Here so that no test module imports another."""

from backends.kv_blocks import ReplicaBlocks
from backends.kv_events import decode_batch, seq_of
from backends.kv_feed import Feed
from tests.backends.kv_fixtures import load


A, B = load("vllm_cpu_replica_A.msgpack"), load("vllm_cpu_replica_B.msgpack")


def batches(fixture) -> list[tuple[int, bytes]]:
    return [(seq_of(f[1]), f[2]) for f in fixture["frames"]]


def run(items, replay=None, start=False) -> Feed:
    feed = Feed(ReplicaBlocks(), replay=replay)
    if start:
        feed.start()
    for seq, payload in items:
        feed.live(seq, payload)
    return feed


def state(feed: Feed) -> tuple:
    """What the page draws: the live blocks (hash, tokens, medium, depth) and the prefix trees."""
    b = feed.blocks
    s = b.live_slots()
    rows = sorted(
        zip(
            b.cols["h64"][s].tolist(),
            b.cols["tokens"][s].tolist(),
            b.cols["medium"][s].tolist(),
            b.cols["depth"][s].tolist(),
        )
    )
    trees = sorted((r.h64, r.blocks) for r in b.roots.values())
    return rows, trees


def first_index(items, kind) -> int:
    return next(
        i
        for i, (_, p) in enumerate(items)
        if any(isinstance(e, kind) for e in decode_batch(p).events)
    )


VLLM = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5
"""


LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
llamacpp:tokens_predicted_total 3469
llamacpp:kv_cache_usage_ratio 0.125
llamacpp:requests_processing 1
llamacpp:requests_deferred 0
"""


class _Backend:
    """Feeds the monitor a scripted series of /metrics texts (the HTTP side is tested elsewhere)."""

    def __init__(self, texts):
        self.texts = list(texts)

    def metrics_text(self):
        return self.texts.pop(0) if self.texts else None

    def latest_snapshot(self):
        raise RuntimeError("the backend exposes no KV snapshot (GET /api/kv: HTTP 404)")
