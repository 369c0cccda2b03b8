"""Helpers the chat handler tests share (a ChatContext over a fake engine and a real SQLite store,
the handler call shapes), here so that no test module imports another."""

import asyncio
import re
from contextlib import contextmanager
from storage import Storage
from tests.ui.fake_engine import request
from ui.chat.context import ChatContext
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


@contextmanager
def chat_context(llm, folder):
    """A ChatContext over `llm` and a real SQLite store in `folder`, closed afterwards. The system
    prompt is short: the fake's context is 40 words (the real default is a ~550-token policy)."""
    st = Storage(folder / "chat.db")
    st.set_system_prompt("You are a helpful assistant.")
    c = ChatContext(llm, st, TabRegistry(llm))
    try:
        yield c
    finally:
        c.tabs.shutdown()
        st.close()


def req(session="s1", username=None):
    return request(session, username)


async def collect(agen):
    return [out async for out in agen]


def run(coro):
    return asyncio.run(coro)


def texts(out):
    return [(m["role"], view.shown_text(m["content"]).split("\n\n<span")[0]) for m in out[1]]


def prop(update, key):
    """A property of a returned update (a component object or an update dict)."""
    return update[key] if isinstance(update, dict) else getattr(update, key)


NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


SAMPLE = re.compile(rf'^({NAME})(\{{(?:[a-zA-Z_]\w*="(?:[^"\\]|\\.)*",?)*\}})? (\S+)$')


def parse(text: str) -> dict:
    """Strict exposition-format reader: every sample has HELP and TYPE before it, once."""
    assert text.endswith("\n")
    meta, values = {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, help_ = line[7:].split(" ", 1)
            assert re.fullmatch(NAME, name) and help_ and name not in meta
            meta[name] = {"help": help_}
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert kind in ("gauge", "counter") and "type" not in meta[name]
            meta[name]["type"] = kind
        else:
            m = SAMPLE.match(line)
            assert m, line
            name = m.group(1)
            assert "type" in meta[name], f"{name} has no # TYPE before it"
            assert name not in values
            values[name] = (float(m.group(3)), m.group(2) or "")
    return {"meta": meta, "values": values}
