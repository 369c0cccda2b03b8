"""Fixtures several chat handler test modules share (a module's own fixture of the same name wins)."""

import pytest

from tests.ui.fake_engine import FakeLLM
from tests.ui.helpers import chat_context


@pytest.fixture
def ctx(tmp_path):
    """A ChatContext over the scripted fake engine and a real SQLite store in tmp_path."""
    with chat_context(FakeLLM(), tmp_path) as c:
        yield c
