"""Random operation sequences against a KVCacheManager with a state group (a model with linear-
attention layers), the block machine's rules (tests/engine/kv/test_kv_cache_properties.py: prefix hits
and salts, next turns adopting parked sessions, chunked growth, forks, free / preempt / park,
releasing parked sessions) on a small state pool, checking after every step:

- no leak, refcounts equal holders: every state slot's count is the number of running sequences,
  parked sessions and checkpoints holding it; the free list holds exactly the others; freeing
  everything at the end leaves only the checkpoints, and dropping those every slot;
- contents: the simulated state pool stores, per slot, the token ids the state has consumed (state
  copies run first, as in the runner; a step from position 0 starts from nothing). Every running
  sequence's state must be exactly its computed tokens, every parked session's its tokens, every
  taken checkpoint's the prefix it is keyed on: a missing copy on write, a wrong restore or a
  state adopted at the wrong length shows up as a wrong history;
- a checkpoint is used only on its own live prefix: each restore is checked as it happens (its
  key block is in the pool's prefix cache and is the new sequence's block k - 1, and the
  sequence starts at exactly k blocks).
"""

import os

from hypothesis import settings

from tests.engine.kv.state_machine import StateMachine

settings.register_profile("state-ci", max_examples=60, stateful_step_count=60, deadline=None)


StateMachine.TestCase.settings = settings.get_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "state-ci")
)
TestStatePoolProperties = StateMachine.TestCase
