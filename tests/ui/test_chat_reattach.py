"""Replies belong to the server (ui/chat/reattach.py, issue 26.1): a cancelled handler (reload, closed
tab, dropped network) does not end the reply; a tab that opens the chat again reattaches and sees
what was generated meanwhile; only Stop, or the idle timeout of a reply nobody watches, ends it.
Against the scripted fake engine and a real SQLite store."""

import asyncio
import threading
import time
import types
from concurrent.futures import Future

import pytest

from tests.ui.fake_engine import FakeLLM, request
from tests.ui.helpers import chat_context
from ui.chat import beam
from ui.chat import handlers as chat
from ui.chat import reattach
from ui.chat import sidebar as side
from ui.chat.tabs import TabRegistry
from ui.chat import view

KW = {
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_tokens": 8,
    "repetition_penalty": 1.0,
    "seed": None,
    "n": 1,
}


@pytest.fixture
def ctx(tmp_path):
    with chat_context(FakeLLM(words=["Once", " upon", " a", " time"]), tmp_path) as c:
        yield c


def settle(ctx):
    ctx.tabs._jobs.submit(lambda: None).result(timeout=5)


async def _reload_once_painted(ctx, agen, word: str, session: str, gate: bool = True):
    """Run handler `agen` of tab `session` until `word` is painted (then gate the engine: it is
    "slow" from here, unless gate=False), then close the tab and cancel the handler as Gradio does
    on a reload / closed tab. Returns the conversation and its running job (Turn or BeamTurn)."""
    seen = []

    async def consume():
        async for out in agen:
            seen.append(out)
            if gate and any(word in str(o) for o in out):
                ctx.llm.gate.clear()

    task = asyncio.create_task(consume())
    while not any(word in str(o) for o in seen):
        await asyncio.sleep(0.001)
    conv = ctx.tab(request(session)).conv_id
    job = ctx.tabs.turn(conv)
    ctx.tabs.close(session, grace=True)  # demo.unload of the reloading tab...
    task.cancel()  # ...and Gradio cancels its handler
    with pytest.raises(asyncio.CancelledError):
        await task
    return conv, job


async def _start_and_cancel_after(ctx, word: str, session="s1"):
    """Send from tab `session`, reload it once `word` is painted. Returns the running turn."""
    return await _reload_once_painted(
        ctx, chat.send(ctx, "Story", dict(KW), request(session)), word, session
    )


async def _aborted(ctx):
    """Until the engine got Stop's abort (a fixed sleep let a loaded box release the gate first,
    and one more word arrived before the abort)."""
    for _ in range(500):
        if ctx.llm.aborted:
            return
        await asyncio.sleep(0.01)


def test_a_cancelled_handler_does_not_end_the_reply_and_it_is_stored_complete(ctx):
    async def scenario():
        conv, turn = await _start_and_cancel_after(ctx, "upon")
        await asyncio.sleep(0.05)
        assert not turn.finished  # still generating on the server
        ctx.llm.gate.set()
        await turn.task
        return conv

    conv = asyncio.run(scenario())
    settle(ctx)
    reply = ctx.storage.get_messages(conv)[-1]
    assert reply["status"] == "complete" and reply["content"] == "Once upon a time"
    assert reply["token_ids"] == [100, 101, 102, 103]
    assert ctx.llm.aborted == []  # nothing aborted it
    assert ctx.llm.ended == [conv]  # nobody shows it any more: released when it ended


def test_a_reloaded_tab_reattaches_and_paints_what_was_generated_meanwhile(ctx):
    async def scenario():
        conv, turn = await _start_and_cancel_after(ctx, "upon")
        # the reloaded page is a new Gradio session that opens the chat from its address (/?c=...)
        new = request("s2")
        new.query_params = {"c": conv}
        side.on_load(ctx, new)
        ctx.llm.gate.set()
        outs = [out async for out in chat.follow(ctx, new)]
        return conv, outs

    conv, outs = asyncio.run(scenario())
    painted = [str(o[1]) for o in outs if isinstance(o[1], list)]
    assert any("Once upon" in p for p in painted)  # the text from before the reload
    assert "Once upon a time" in painted[-1]  # and the end of the reply, live
    assert ctx.storage.get_messages(conv)[-1]["status"] == "complete"


async def _stop_from_another_tab(ctx, conv, session="s3"):
    """Press Stop in a tab that opened the chat, let the gated engine go once the abort arrived."""
    ctx.tabs.open(ctx.tab(request(session)), conv)
    stop = asyncio.create_task(chat.stop(ctx, request(session)))
    await _aborted(ctx)
    ctx.llm.gate.set()
    await stop


@pytest.mark.parametrize(
    "start,word,stored",
    [("reply", "upon", "Once upon"), ("continued", "and", "Once upon a time and")],
)
def test_stop_is_what_ends_a_reply_even_after_its_page_reloaded(ctx, start, word, stored):
    """A reply (or a continued one) whose handler was cancelled by a reload ends only by Stop."""

    async def scenario():
        begin = _start_and_cancel_after if start == "reply" else _continue_and_cancel_after
        conv, turn = await begin(ctx, word)
        await _stop_from_another_tab(ctx, conv)
        return conv

    conv = asyncio.run(scenario())
    reply = ctx.storage.get_messages(conv)[-1]
    assert reply["status"] == "stopped" and reply["content"] == stored
    assert len(ctx.llm.aborted) == 1


def test_a_reply_nobody_watches_is_aborted_after_the_idle_timeout(ctx):
    ctx.abandon_s = 0.2
    orig = reattach.CHECK_S
    reattach.CHECK_S = 0.02
    try:

        async def scenario():
            conv, turn = await _start_and_cancel_after(ctx, "upon")
            for _ in range(500):  # nobody presses Stop
                if ctx.llm.aborted:
                    break
                await asyncio.sleep(0.01)
            ctx.llm.gate.set()  # the engine takes the abort
            await asyncio.wait_for(asyncio.shield(turn.task), 5)
            return conv, turn

        conv, turn = asyncio.run(scenario())
    finally:
        reattach.CHECK_S = orig
    assert turn.abandoned and len(ctx.llm.aborted) == 1
    assert ctx.storage.get_messages(conv)[-1]["status"] == "stopped"


def test_a_watched_reply_never_times_out(ctx):
    ctx.abandon_s = 0.05

    async def scenario():
        turn_box = {}
        tab = ctx.tab(request("s1"))
        agen = chat.send(ctx, "Story", dict(KW), request("s1"))
        ctx.llm.pause_s = 0.1  # a reply longer than the timeout
        async for _ in agen:
            turn_box.setdefault("t", ctx.tabs.turn(tab.conv_id))
        return tab.conv_id, turn_box["t"]

    conv, turn = asyncio.run(scenario())
    assert not turn.abandoned and ctx.llm.aborted == []
    assert ctx.storage.get_messages(conv)[-1]["status"] == "complete"


def test_a_closed_tab_parks_its_chat_and_a_reload_in_time_keeps_it_live(tmp_path):
    llm = FakeLLM()
    reg = TabRegistry(llm, release_grace_s=0.3)
    try:
        reg.open(reg.get("s1"), "A")
        reg.close("s1", grace=True)  # reload: unload first...
        assert reg.chat_states() == {"A": "parked"}
        reg.open(reg.get("s2"), "A")  # ...then the new page opens the same chat
        assert reg.chat_states() == {"A": "open"}
        reg.open(reg.get("s3"), "B")
        reg.close("s3", grace=True)  # a tab closed for good
        import time

        time.sleep(0.5)
        reg._jobs.submit(lambda: None).result(timeout=5)
        assert llm.ended == ["B"]  # B released after the grace, A kept
        assert reg.chat_states() == {"A": "open"}
        reg.close("s2")  # an explicit goodbye releases at once
        reg._jobs.submit(lambda: None).result(timeout=5)
        assert llm.ended == ["B", "A"]
    finally:
        reg.shutdown()


# ---- Continue: a continued reply belongs to the server like any other -----------------------------


async def _continue_and_cancel_after(ctx, word: str, session="s1"):
    """Store a finished reply "Once upon a time", then Continue it from tab `session` with three more
    words; once `word` is painted, gate the engine and cancel the handler as a reload does.
    Returns the conversation id and the running turn."""
    async for _ in chat.send(ctx, "Story", dict(KW), request(session)):
        pass
    ctx.llm.words = [" and", " then", " more"]
    conv, turn = await _reload_once_painted(
        ctx, chat.continue_reply(ctx, dict(KW), request(session)), word, session
    )
    assert turn.continues is not None
    return conv, turn


def test_a_continued_reply_outlives_its_reloaded_page_and_is_stored_complete(ctx):
    async def scenario():
        conv, turn = await _continue_and_cancel_after(ctx, "and")
        await asyncio.sleep(0.05)
        assert not turn.finished  # the cancel did not end it
        ctx.llm.gate.set()
        await asyncio.wait_for(asyncio.shield(turn.task), 5)
        return conv

    conv = asyncio.run(scenario())
    settle(ctx)
    replies = [m for m in ctx.storage.get_messages(conv) if m["role"] == "assistant"]
    assert len(replies) == 1  # extended in place, not a second reply
    assert (
        replies[0]["status"] == "complete"
        and replies[0]["content"] == "Once upon a time and then more"
    )
    assert replies[0]["token_ids"] == [100, 101, 102, 103, 100, 101, 102]
    assert ctx.llm.aborted == []


def test_a_reloaded_tab_reattaches_to_a_continued_reply(ctx):
    async def scenario():
        conv, turn = await _continue_and_cancel_after(ctx, "and")
        new = request("s2")
        new.query_params = {"c": conv}
        side.on_load(ctx, new)
        ctx.llm.gate.set()
        return conv, [out async for out in chat.follow(ctx, new)]

    conv, outs = asyncio.run(scenario())
    painted = [str(o[1]) for o in outs if isinstance(o[1], list)]
    assert any("Once upon a time and" in p for p in painted)  # the reply so far, then...
    assert "Once upon a time and then more" in painted[-1]  # ...its end, live
    assert ctx.storage.get_messages(conv)[-1]["status"] == "complete"


def test_an_abandoned_continued_reply_times_out(ctx, monkeypatch):
    ctx.abandon_s = 0.2
    monkeypatch.setattr(reattach, "CHECK_S", 0.02)

    async def scenario():
        conv, turn = await _continue_and_cancel_after(ctx, "and")
        for _ in range(500):
            if ctx.llm.aborted:
                break
            await asyncio.sleep(0.01)
        ctx.llm.gate.set()
        await asyncio.wait_for(asyncio.shield(turn.task), 5)
        return conv, turn

    conv, turn = asyncio.run(scenario())
    assert turn.abandoned and len(ctx.llm.aborted) == 1
    assert ctx.storage.get_messages(conv)[-1]["status"] == "stopped"


# ---- Beam search: a search belongs to the server too (ui/chat/beam.BeamTurn) -------------------------


class _Search:
    """A submitted fake search: finishes (two beams) once the engine's gate is open, or fails
    the way the engine fails an aborted one."""

    def __init__(self, llm, rid, width):
        self.llm, self.request_id, self.future = llm, rid, Future()
        self.beams = [(f"Beam text {k}", [200 + k, 300 + k]) for k in range(width)]
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.llm.gate.is_set() and not self.future.done():
            time.sleep(0.005)
        seqs = [
            types.SimpleNamespace(
                text=t, token_ids=ids, score=-0.5 - k, cum_logprob=-1.0 - k, finish_reason="length"
            )
            for k, (t, ids) in enumerate(self.beams)
        ]
        if not self.future.done():
            self.future.set_result(types.SimpleNamespace(sequences=seqs))

    def abort(self):
        return self.llm.abort(self.request_id)

    def __await__(self):
        return asyncio.wrap_future(self.future).__await__()


class BeamFake(FakeLLM):
    """The fake engine with a beam search that waits for `gate` like its streams do."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.searches: dict[str, _Search] = {}

    def submit_beam_search(
        self,
        prompt,
        params,
        *,
        on_step=None,
        request_id=None,
        cache_salt=None,
        tenant=None,
        priority=0,
    ):
        s = self.searches[request_id] = _Search(self, request_id, params.beam_width)
        s.tenant = tenant
        return s

    def abort(self, request_id):
        super().abort(request_id)
        s = self.searches.get(request_id)
        if s is not None and not s.future.done():
            s.future.set_exception(RuntimeError("beam search aborted"))
        return True


@pytest.fixture
def beam_ctx(tmp_path, monkeypatch):
    monkeypatch.setattr(
        beam, "prompt_ids", lambda llm, messages: [1, 2, 3]
    )  # no chat template in the fake
    with chat_context(BeamFake(), tmp_path) as c:
        yield c


async def _search_and_cancel(ctx, session="s1"):
    """Send with beam search (width 2) from tab `session` while the engine is held; once the page
    says "searching", cancel the handler as a reload does. Returns the conversation and the search."""
    ctx.llm.gate.clear()
    agen = chat.send(ctx, "Story", {**KW, "beam_width": 2}, request(session))
    conv, bt = await _reload_once_painted(ctx, agen, "searching", session, gate=False)
    assert isinstance(bt, beam.BeamTurn)
    return conv, bt


def test_a_beam_search_outlives_its_reloaded_page_and_is_stored(beam_ctx):
    ctx = beam_ctx

    async def scenario():
        conv, bt = await _search_and_cancel(ctx)
        await asyncio.sleep(0.05)
        assert not bt.finished  # the cancel did not end the search
        ctx.llm.gate.set()
        await asyncio.wait_for(asyncio.shield(bt.task), 5)
        return conv, bt

    conv, bt = asyncio.run(scenario())
    settle(ctx)
    assert ctx.llm.aborted == [] and len(bt.stored) == 2
    assert ctx.llm.searches[bt.rid].tenant == bt.tenant == "local"  # scheduled as the chat's user
    shown = ctx.storage.get_messages(conv)
    assert [m["role"] for m in shown] == ["user", "assistant"] and view.shown_text(
        shown[-1]["content"]
    ).startswith("Beam text 0")
    assert shown[-1]["token_ids"] == [200, 300] and shown[-1]["id"] == bt.stored[0]
    assert ctx.storage.get_message(bt.stored[1])["content"] == "Beam text 1"
    assert not ctx.tabs.is_busy(conv)


def test_a_reloaded_tab_shows_the_search_running_then_the_beams(beam_ctx):
    ctx = beam_ctx

    async def scenario():
        conv, bt = await _search_and_cancel(ctx)
        new = request("s2")
        new.query_params = {"c": conv}
        side.on_load(ctx, new)
        outs = []
        async for out in chat.follow(ctx, new):
            outs.append(out)
            if len(outs) == 1:
                ctx.llm.gate.set()  # the search ends while the new page shows it
        return conv, outs

    conv, outs = asyncio.run(scenario())
    painted = [str(o[1]) for o in outs if isinstance(o[1], list)]
    assert "searching" in painted[0]
    assert "Beam text 0" in painted[-1] and "searching" not in painted[-1]
    alts = [md.value for md in outs[-1][5:7]]
    assert "Beam 1" in alts[0] and "Beam 2" in alts[1] and "Beam text 1" in alts[1]  # side by side
    assert len(ctx.tab(request("s2")).alt_ids) == 2  # each can be picked


def test_stop_aborts_a_beam_search_whose_page_reloaded(beam_ctx):
    ctx = beam_ctx

    async def scenario():
        conv, bt = await _search_and_cancel(ctx)
        ctx.tabs.open(ctx.tab(request("s3")), conv)
        out = await chat.stop(ctx, request("s3"))
        await asyncio.wait_for(asyncio.shield(bt.task), 5)
        return conv, bt, out

    conv, bt, out = asyncio.run(scenario())
    assert ctx.llm.aborted == [bt.rid] and bt.error is None and bt.stored == []
    assert out[1] == "stopped"
    assert [m["role"] for m in ctx.storage.get_messages(conv)] == [
        "user"
    ]  # a search keeps no half beams
    assert not ctx.tabs.is_busy(conv)


def test_an_abandoned_beam_search_times_out(beam_ctx, monkeypatch):
    ctx = beam_ctx
    ctx.abandon_s = 0.2
    monkeypatch.setattr(reattach, "CHECK_S", 0.02)

    async def scenario():
        conv, bt = await _search_and_cancel(ctx)
        await asyncio.wait_for(asyncio.shield(bt.task), 10)  # nobody presses Stop
        return bt

    bt = asyncio.run(scenario())
    assert bt.abandoned and ctx.llm.aborted == [bt.rid] and bt.stored == []
