"""Random add / append / fork / free / preempt / park / evict / load / corrupt / restart / delete
sequences against KVCacheManager with a file-backed KV tier, checking after every step:

- everything tests/engine/kv/test_kv_cache_properties.py checks (refcounts, free list, cached map,
  counters, and the simulated pool: every slot holds the token whose KV it should hold, so a block
  loaded from the tier with the wrong bytes shows);
- the tier: its index equals the files on disk, its byte count equals the files' sizes and stays
  within capacity, the folder never held more than the capacity right after any write (issue
  48.7), every entry's bytes are exactly its block's token ids, salted chains keep their salt, and
  a corrupted file is dropped when read, never loaded.
The simulated pool is a list of token ids; the tier stores a block's slots as int64 bytes.
"""

import os

from hypothesis import settings

from tests.engine.kv.helpers import TierMachine

settings.register_profile("tier-ci", max_examples=80, stateful_step_count=100, deadline=None)


TierMachine.TestCase.settings = settings.get_profile(
    os.environ.get("KV_TIER_HYPOTHESIS_PROFILE", "tier-ci")
)
TestKVTierProperties = TierMachine.TestCase
