"""A model-free driver for the real Scheduler + KVCacheManager: each step, every scheduled sequence
whose last token was computed "samples" one more token (a fixed id); a sequence ends after
max_tokens. What the policy decides is then exactly what the scheduler does with real blocks.
The fair policy's clock is the step count times STEP_S (deterministic: the time bound of the
no-starvation rule is reached after a known number of steps, whatever the machine's load)."""

from __future__ import annotations

from engine.core.fairness import make_policy
from engine.kv.kv_cache_manager import KVCacheManager
from engine.sampling.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Request, Sequence, SeqStatus


STEP_S = 0.01  # simulated seconds per step


class Sim:
    def __init__(
        self,
        policy="fair",
        *,
        num_blocks=64,
        block_size=16,
        max_num_seqs=4,
        budget=64,
        weights=None,
        **policy_kw,
    ):
        self.kv = KVCacheManager(num_blocks, block_size, max_model_len=4096)
        self.step_no = 0
        if policy == "fair":
            policy_kw.setdefault("clock", lambda: 1e6 + self.step_no * STEP_S)  # far from 0
        self.policy = (
            make_policy(policy, weights, **policy_kw) if isinstance(policy, str) else policy
        )
        self.sched = Scheduler(self.kv, max_num_seqs, budget, self.policy)
        self.step_no = 0
        self.finished: dict[str, Sequence] = {}
        self.admissions: list[str] = []  # request ids in the order first admitted
        self.first_token_step: dict[str, int] = {}
        self.tokens_by_tenant: dict[str, int] = {}
        self.computed_by_tenant: dict[str, int] = {}
        self._n = 0

    def add(
        self,
        tenant="local",
        prompt_len=20,
        max_tokens=8,
        priority=0,
        prompt=None,
        session=None,
        rid=None,
    ):
        rid = rid or f"r{self._n}"
        self._n += 1
        ids = (
            list(prompt)
            if prompt is not None
            else [(self._n * 7 + i) % 1000 + 3 for i in range(prompt_len)]
        )
        req = Request(
            rid,
            ids,
            SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
            session_id=session,
            tenant=tenant,
            priority=priority,
        )
        seq = Sequence(f"{rid}#0", req, 0, list(ids), None, None)
        req.seqs.append(seq)
        self.sched.add(seq)
        return seq

    def step(self) -> list:
        plan = self.sched.schedule()
        self.step_no += 1
        for row in plan.rows:
            seq, start, n = row.seq, row.start, row.num_tokens
            rid = seq.request.request_id
            if rid not in self.admissions:
                self.admissions.append(rid)
            t = seq.request.tenant
            self.computed_by_tenant[t] = self.computed_by_tenant.get(t, 0) + n
            if start + n == len(seq.token_ids):
                seq.token_ids.append(1)
                self.first_token_step.setdefault(rid, self.step_no)
                self.tokens_by_tenant[t] = self.tokens_by_tenant.get(t, 0) + 1
                if len(seq.output_ids) >= seq.request.params.max_tokens:
                    self.sched.remove(seq)
                    self.kv.free(seq.seq_id)
                    seq.status = SeqStatus.FINISHED
                    self.finished[rid] = seq
        return plan

    def run(self, max_steps=10_000, until=None):
        while self.sched.has_work() and self.step_no < max_steps:
            self.step()
            if until is not None and until(self):
                return
        assert not self.sched.has_work(), "the simulation did not finish"

    def counter(self, tenant) -> float:
        return self.policy.tenants[tenant].counter
