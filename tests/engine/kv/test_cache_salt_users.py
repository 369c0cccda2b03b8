"""Issue #12.2: under --auth the prefix cache must not let one user confirm another's text.

The attack: alice sends a message with a secret; bob sends the same system prompt plus a guess of
her message, then reads "N/M prompt tokens from cache". With a per-user salt that spares only the
leading system prompt, right and wrong guesses get the same cached count, and the system prompt's
blocks are still shared by both users. Real model, real engine.
"""

from engine import SamplingParams
from engine.text.session_prompt import continue_session_prompt, shared_system_tokens

SYSTEM = (
    "You are a careful assistant for the accounting team of a mid-sized company. Answer briefly, "
    "cite figures exactly as given, and never invent numbers that were not in the question."
)
PAD = " Please remember it for the rest of this conversation and confirm with one word only."
RIGHT = "My locker code is 4711 ALPHA ZULU." + PAD
WRONG = "My locker code is 9038 KILO MIKE." + PAD
GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


def cached(llm, text, salt, session):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    last = None
    for d in llm.submit_chat(msgs, GREEDY, session_id=session, cache_salt=salt):
        last = d
    return last.metrics["cached_tokens"], last.metrics["prompt_tokens"]


def attack(make_llm, guess, salts):
    """A fresh engine: alice sends her secret, then bob sends `guess`; bob's cached count."""
    llm = make_llm(block_size=16)
    cached(llm, RIGHT, salts[0], "alice-chat")
    llm.end_session("alice-chat")  # parked blocks stay cached (hashed)
    return cached(llm, guess, salts[1], "bob-chat")[0], llm


def test_oracle_attack_sees_the_same_count_for_right_and_wrong_guesses(make_llm):
    right, llm = attack(make_llm, RIGHT, ("alice", "bob"))
    wrong, _ = attack(make_llm, WRONG, ("alice", "bob"))
    assert right == wrong  # nothing distinguishes the guesses
    tok = llm.get_tokenizer()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": RIGHT}]
    shared = shared_system_tokens(tok, msgs, continue_session_prompt(tok, msgs, None))
    assert shared >= 32  # the system prompt spans at least two full blocks
    assert right == (shared // 16) * 16  # ... and bob still reuses all its full blocks
    mine, _ = cached(llm, RIGHT, "alice", "alice-2")
    assert mine > right  # alice's own repeat still hits beyond the prompt


def test_without_a_salt_the_same_attack_works(make_llm):
    """The control: the measurement tells right from wrong when nothing is salted."""
    right, _ = attack(make_llm, RIGHT, (None, None))
    wrong, _ = attack(make_llm, WRONG, (None, None))
    assert right > wrong


def test_two_users_share_the_system_prompt_blocks(make_llm):
    """Both users' parked chats hold the same physical blocks for the system prompt (shared), and
    different ones for everything after it, although both sent the very same message."""
    llm = make_llm(block_size=16)
    cached(llm, RIGHT, "alice", "a")  # parked sessions keep their whole tables
    cached(llm, RIGHT, "bob", "b")
    views = {s.session_id: s for s in llm.kv_snapshot().sequences}
    a, b = views["a"].block_table, views["b"].block_table
    tok = llm.get_tokenizer()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": RIGHT}]
    ids = continue_session_prompt(tok, msgs, None)
    full_shared = shared_system_tokens(tok, msgs, ids) // 16
    assert full_shared >= 2
    assert a[:full_shared] == b[:full_shared]
    assert not set(a[full_shared:]) & set(b[full_shared:])
