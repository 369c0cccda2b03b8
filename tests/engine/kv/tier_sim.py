"""A KV tier in a folder, and a KVCacheManager with one over a simulated pool (a token id per slot):
what tests/engine/kv/test_kv_tier.py and the dashboard's tier test build on. Here so that no test
module imports another."""

from array import array

from engine.kv.kv_cache_manager import KVCacheManager
from engine.kv.tier.store import FileStore, KVTier


FP = "f" * 24


def tier_at(path, cap=10_000, fp=FP):
    return KVTier(FileStore(str(path)), fp, cap)


# ---- the manager with a tier, on a simulated pool (token id per slot) ------------------------
BS = 8


class SimIO:
    """read/write of one block's slots as bytes, over a list of token ids (None = never written)."""

    def __init__(self, num_blocks):
        self.kv = [-1] * (num_blocks * BS)

    def read(self, bid):
        return array("q", self.kv[bid * BS : (bid + 1) * BS]).tobytes()

    def write(self, bid, data):
        self.kv[bid * BS : (bid + 1) * BS] = array("q", data).tolist()

    def compute(self, m, seq_id, toks, start, end):
        for src, dst in m.take_pending_copies():
            self.kv[dst * BS : (dst + 1) * BS] = self.kv[src * BS : (src + 1) * BS]
        for p, slot in zip(range(start, end), m.slots_for(seq_id, start, end)):
            self.kv[slot] = toks[p]


def manager_with_tier(tmp_path, num_blocks=8, cap=10**7):
    m = KVCacheManager(num_blocks, BS, max_model_len=64, kv_bytes_per_token=8)
    io = SimIO(num_blocks)
    m.attach_tier(tier_at(tmp_path, cap=cap), io)
    return m, io


def run_turn(m, io, sid, toks, session=None, salt=None):
    cached = m.add_sequence(
        sid, toks, num_new_tokens=len(toks), cache_salt=salt, session_id=session
    )
    io.compute(m, sid, toks, cached, len(toks))
    return cached
