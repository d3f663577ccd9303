"""The sessions' operations written once for both adapters: each binds a function of a
shared table-family module to the session's :class:`~fermix.storage.sql.Sql`.

Each adapter's sessions (:mod:`fermix.storage.sqlite.session`,
:mod:`fermix.storage.postgres.session`) derive from :class:`SharedReads` and
:class:`SharedWrites` and bind only the operations whose SQL is their own.
"""

from __future__ import annotations

from fermix.storage import api_tokens
from fermix.storage import conversations as _conversations
from fermix.storage import messages as _messages
from fermix.storage.operation import Session, SqlOp, WriteSession


class SharedReads(Session):
    """The read operations both adapters run with the same SQL."""

    # the memory server's bearer tokens (N2)
    token = SqlOp(api_tokens.get)
    token_by_secret = SqlOp(api_tokens.by_secret)
    tokens = SqlOp(api_tokens.list_tokens)

    # conversations: state, window, review gates
    conversation = SqlOp(_conversations.get)
    conversations = SqlOp(_conversations.list_states)
    window = SqlOp(_conversations.window)
    window_mark = SqlOp(_conversations.window_mark)
    window_snapshot = SqlOp(_conversations.window_snapshot)
    window_since = SqlOp(_conversations.window_since)
    newest_user_message_id = SqlOp(_conversations.newest_user_message_id)
    with_new_user_messages = SqlOp(_conversations.with_new_user_messages)
    review_backlog = SqlOp(_conversations.review_backlog)
    due_reviews = SqlOp(_conversations.due_reviews)

    # messages (each adapter searches them its own way)
    message = SqlOp(_messages.get)
    message_by_client_key = SqlOp(_messages.by_client_key)
    messages = SqlOp(_messages.conversation)
    count_messages = SqlOp(_messages.count)


class SharedWrites(SharedReads, WriteSession):
    """The write operations both adapters run with the same SQL."""

    # the memory server's bearer tokens (N2)
    insert_token = SqlOp(api_tokens.insert)
    revoke_token = SqlOp(api_tokens.revoke)

    # conversations (each adapter inserts messages its own way)
    touch_conversation = SqlOp(_conversations.touch)
    update_conversation = SqlOp(_conversations.update)
    claim_review = SqlOp(_conversations.claim_review)
    claim_due_reviews = SqlOp(_conversations.claim_due_reviews)
    finish_review = SqlOp(_conversations.finish_review)
    release_review = SqlOp(_conversations.release_review)
    fail_review = SqlOp(_conversations.fail_review)
    release_expired_claims = SqlOp(_conversations.release_expired_claims)
