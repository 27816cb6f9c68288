"""Every expected-different port cites a line of docs/zenflow.md or docs/config_keys.md;
that line must exist (a reworded or deleted line fails here, not silently in a reason)."""
import pytest
from conformance_support import DIFFERENCES, NOTES


@pytest.mark.parametrize("key", sorted(DIFFERENCES) + sorted(NOTES))
def test_cited_line_is_in_the_docs(key):
    diff = DIFFERENCES.get(key) or NOTES[key]
    number, _ = diff.line()
    assert number is not None, f"{key}: no line of docs/{diff.doc} holds {diff.fragments}"
