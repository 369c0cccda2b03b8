"""A chat turn on a real engine with --speculative: the handlers store the reply with its stats
(the storage schema knows the speculative fields, m006) and the line under it says how many tokens
came from accepted drafts. A reply of a speculative engine used to fail when its stats were stored."""

import asyncio

import pytest

from tests.ui.fake_engine import request
from tests.ui.helpers import KW, chat_context, collect
from ui.chat import handlers as chat
from ui.chat import view

CODE = "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"


@pytest.fixture(scope="module")
def llm():
    from engine import ServingLLM

    m = ServingLLM(
        num_blocks=256, max_model_len=1024, speculative="ngram", speculative_adaptive=False
    )
    yield m
    m.shutdown()


def test_a_speculative_reply_is_stored_with_its_draft_stats(llm, tmp_path):
    with chat_context(llm, tmp_path) as ctx:
        msg = f"Rename w to width and h to height; show the whole code:\n```python\n{CODE}```"
        outs = asyncio.run(collect(chat.send(ctx, msg, dict(KW, max_tokens=60), request("s1"))))
        conv = ctx.storage.list_conversations()[0]
        reply = ctx.storage.get_messages(conv["id"])[-1]
        assert reply["role"] == "assistant" and reply["status"] == "complete"
        st = reply["stats"]
        assert st["spec_accepted_tokens"] > 0 and 0 < st["decode_steps"] < st["output_tokens"]
        line = view.shown_text(outs[-1][1][-1]["content"])
        assert (
            f"{st['spec_accepted_tokens']} accepted from drafts" in line and "tokens/step" in line
        )
