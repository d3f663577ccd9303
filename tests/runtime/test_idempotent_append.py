import pytest

from fermix.errors import ConflictError


def test_n3_same_key_stored_once(memory):
    conv = memory.conversation("a", "cli", "1", owner_id="o")
    first = conv.append_user("hello", client_key="k1")
    again = conv.append_user("hello", client_key="k1")
    assert again.id == first.id
    assert [m.content for m in conv.history()] == ["hello"]
    with pytest.raises(ConflictError):
        conv.append_user("other", client_key="k1")
    other = memory.conversation("a", "cli", "2", owner_id="o").append_user("hello", client_key="k1")
    assert other.id != first.id
