"""Honest reply states and finish reasons (ui/chat/states.py), and the `< k/n >` arrows (view)."""

from ui.chat import states, view


def test_finish_reason_tells_context_full_from_max_tokens():
    ctx_full = {"finish_reason": "length", "prompt_tokens": 600, "output_tokens": 40}
    assert states.finish_text(ctx_full, "complete", 640) == "context full (640/640 tokens)"
    max_tok = {"finish_reason": "length", "prompt_tokens": 100, "output_tokens": 40}
    assert states.finish_text(max_tok, "complete", 640) == "max tokens reached"


def test_finish_reason_tells_end_of_turn_from_stop_sequence_and_stopped():
    stop = {"finish_reason": "stop"}
    assert states.finish_text(stop, "complete", 640, last_token=2, eos_ids={2}) == "end of turn"
    assert states.finish_text(stop, "complete", 640, last_token=77, eos_ids={2}) == "stop sequence"
    assert states.finish_text(stop, "stopped") == "stopped"
    assert states.finish_text({}, "error") == "error"
    assert states.finish_text({}, "complete") == ""


def test_live_status_words():
    assert (
        states.live_status(states.QUEUED, 3) == "server busy, your message is queued as number 3…"
    )
    assert states.live_status(states.PAUSED) == "paused: memory full, resuming…"
    assert states.live_status(states.GENERATING) == "generating…"


def test_turn_is_paused_from_the_preempted_event_until_tokens_flow_again():
    from engine.core.sequence import RequestOutputDelta
    from ui.chat.turn import Turn

    def delta(state, toks=(), index=0, finished=False):
        return RequestOutputDelta(
            "chat-a", index, "x" if toks else "", list(toks), finished, None, None, {"state": state}
        )

    t = Turn("c", 1, 2)
    t.note_state(delta("running"))
    assert t.admitted and not t.paused
    t.note_state(delta("running", [5]))
    t.note_state(delta("preempted"))
    assert t.paused and t.preemptions == 1
    t.note_state(delta("resumed"))
    assert t.paused  # recomputing its context: still "memory full, resuming…"
    t.note_state(delta("preempted", index=1))
    t.note_state(delta("running", [6]))
    assert t.paused  # output 1 still waits
    t.note_state(delta("finished", index=1, finished=True))
    assert not t.paused and t.preemptions == 2


def test_branch_arrows_link_to_the_neighbouring_versions_only():
    assert view.branch_nav(5, [5, 9]).count("#branch-") == 1 and "1/2" in view.branch_nav(5, [5, 9])
    mid = view.branch_nav(9, [5, 9, 12])
    assert "#branch-5" in mid and "#branch-12" in mid and "2/3" in mid
    path = [
        {"id": 1, "role": "user", "content": "q"},
        {
            "id": 9,
            "role": "assistant",
            "content": "a",
            "stats": {"finish_reason": "length", "prompt_tokens": 10, "output_tokens": 6},
            "status": "complete",
            "token_ids": [4],
        },
    ]
    shown, ids = view.display_messages(path, {9: [5, 9]}, max_model_len=16)
    text = view.shown_text(shown[1]["content"])
    assert ids == [1, 9] and "2/2" in text and "context full (16/16 tokens)" in text
    assert "branch" not in shown[0]["content"]


def test_decoding_choice_maps_to_a_beam_width():
    from ui.chat import beam

    assert beam.beam_width("sample") == 0 and beam.beam_width(None) == 0
    assert beam.beam_width("beam search (width 3)") == 3
    assert beam.beam_width("beam search (width 3); drop table") == 0
    assert all(beam.beam_width(c) >= 2 for c in beam.CHOICES[1:])
