"""Random operation sequences against KVCacheManager, checking its invariants after every step.

Besides the bookkeeping (refcounts, free list, cached map, counters) the machine simulates the
physical KV pool: every computed token id is "written" to its slot after the step's pending
copy-on-write copies ran, so a block reused wrongly (stale prefix hit, missing CoW, bad session
adoption) shows up as a slot holding the wrong token.
"""

import os

from hypothesis import settings

from tests.engine.kv.helpers import KVMachine


KVMachine.TestCase.settings = settings.get_profile(os.environ.get("KV_HYPOTHESIS_PROFILE", "kv-ci"))
TestKVCacheManagerProperties = KVMachine.TestCase
