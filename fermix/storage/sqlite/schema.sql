-- fermix schema, as numbered migrations.
--
-- Each block starts with a line "-- migration N: name" and runs in its own transaction,
-- together with its row in schema_migrations and PRAGMA user_version = N.
-- Never edit a released block: add a new one. Times are integer milliseconds since the epoch.

-- migration 1: initial tables of the seed
CREATE TABLE schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at INTEGER NOT NULL
);

CREATE TABLE messages (
    id            INTEGER PRIMARY KEY,
    agent_id      TEXT NOT NULL,
    owner_id      TEXT NOT NULL DEFAULT '',
    channel       TEXT NOT NULL,
    chat_id       TEXT NOT NULL,
    thread_scope  TEXT NOT NULL DEFAULT '',
    sender        TEXT NOT NULL DEFAULT '',
    role          TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    kind          TEXT NOT NULL DEFAULT 'chat',
    content       TEXT NOT NULL,
    metadata_json TEXT NOT NULL DEFAULT '{}',
    created_at    INTEGER NOT NULL
);
CREATE INDEX messages_conversation
    ON messages (agent_id, channel, chat_id, thread_scope, created_at, id);

-- porter over unicode61: stemming measured best by bench/recall.py (see README).
CREATE VIRTUAL TABLE messages_fts USING fts5 (
    content,
    content = 'messages',
    content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_au AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;

CREATE TABLE memory_sources (
    id          INTEGER PRIMARY KEY,
    agent_id    TEXT NOT NULL,
    owner_id    TEXT NOT NULL DEFAULT '',
    source_type TEXT NOT NULL CHECK (source_type IN ('conversation', 'job', 'realtime', 'operator')),
    name        TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL,
    UNIQUE (agent_id, source_type, name)
);

CREATE TABLE memories (
    id                 INTEGER PRIMARY KEY,
    agent_id           TEXT NOT NULL,
    owner_id           TEXT NOT NULL DEFAULT '',
    scope_type         TEXT NOT NULL CHECK (scope_type IN ('owner', 'agent', 'conversation', 'job')),
    scope_id           TEXT NOT NULL,
    category           TEXT NOT NULL CHECK (category IN
                           ('identity', 'preference', 'interest', 'goal', 'context', 'directive')),
    key                TEXT NOT NULL,
    value              TEXT NOT NULL,
    confidence         REAL NOT NULL DEFAULT 1.0,
    promote_target     TEXT CHECK (promote_target IN ('user_md', 'memory_md')),
    source_id          INTEGER REFERENCES memory_sources (id) ON DELETE SET NULL,
    source_type        TEXT,
    source_name        TEXT,
    source_description TEXT,
    session_id         TEXT,
    run_id             INTEGER,
    source_message_id  INTEGER,
    archived_at        INTEGER,
    archived_by        TEXT,
    archive_reason     TEXT,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    UNIQUE (agent_id, owner_id, scope_type, scope_id, key)
);
CREATE INDEX memories_scope ON memories (agent_id, scope_type, scope_id, archived_at);

CREATE VIRTUAL TABLE memories_fts USING fts5 (
    key,
    value,
    content = 'memories',
    content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, key, value) VALUES (new.id, new.key, new.value);
END;
CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, key, value)
        VALUES ('delete', old.id, old.key, old.value);
END;
CREATE TRIGGER memories_au AFTER UPDATE OF key, value ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, key, value)
        VALUES ('delete', old.id, old.key, old.value);
    INSERT INTO memories_fts (rowid, key, value) VALUES (new.id, new.key, new.value);
END;

CREATE TABLE scheduled_jobs (
    id               INTEGER PRIMARY KEY,
    agent_id         TEXT NOT NULL,
    owner_id         TEXT NOT NULL DEFAULT '',
    name             TEXT NOT NULL,
    schedule         TEXT NOT NULL,
    prompt           TEXT NOT NULL,
    memory_source_id INTEGER NOT NULL REFERENCES memory_sources (id),
    enabled          INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    next_run_at      INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    UNIQUE (agent_id, name)
);

CREATE TABLE job_runs (
    id          INTEGER PRIMARY KEY,
    job_id      INTEGER NOT NULL REFERENCES scheduled_jobs (id) ON DELETE CASCADE,
    status      TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
    output      TEXT NOT NULL DEFAULT '',
    error       TEXT,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER
);
CREATE INDEX job_runs_job ON job_runs (job_id, started_at);

-- A resource is one prompt file of one agent for one owner ('' is the agent's default owner).
CREATE TABLE resources (
    id               INTEGER PRIMARY KEY,
    agent_id         TEXT NOT NULL,
    owner_id         TEXT NOT NULL DEFAULT '',
    name             TEXT NOT NULL CHECK (name IN ('user_md', 'memory_md')),
    current_revision INTEGER NOT NULL DEFAULT 0,
    updated_at       INTEGER NOT NULL,
    UNIQUE (agent_id, owner_id, name)
);

CREATE TABLE resource_revisions (
    id           INTEGER PRIMARY KEY,
    resource_id  INTEGER NOT NULL REFERENCES resources (id) ON DELETE CASCADE,
    revision     INTEGER NOT NULL,
    content      TEXT NOT NULL,
    content_sha1 TEXT NOT NULL,
    reason       TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    UNIQUE (resource_id, revision)
);

-- migration 2: per-conversation state and the memory change counter
-- One row per conversation key: its window, the reviewer's gates and claim (E2), the
-- compactor's recorded peak and backoff (K3). Gates live here so they hold across processes.
CREATE TABLE conversations (
    agent_id                 TEXT NOT NULL,
    channel                  TEXT NOT NULL,
    chat_id                  TEXT NOT NULL,
    thread_scope             TEXT NOT NULL DEFAULT '',
    owner_id                 TEXT NOT NULL DEFAULT '',
    trust                    TEXT NOT NULL DEFAULT 'operator' CHECK (trust IN ('operator', 'guest')),
    window_after_id          INTEGER NOT NULL DEFAULT 0,
    checkpoint_message_id    INTEGER REFERENCES messages (id),
    last_reviewed_at         INTEGER,
    last_reviewed_message_id INTEGER NOT NULL DEFAULT 0,
    review_failed_at         INTEGER,
    review_claim_token       TEXT,
    review_claim_expires_at  INTEGER,
    peak_prompt_tokens       INTEGER,
    compaction_failed_at     INTEGER,
    created_at               INTEGER NOT NULL,
    updated_at               INTEGER NOT NULL,
    PRIMARY KEY (agent_id, channel, chat_id, thread_scope)
) WITHOUT ROWID;

-- Bumped by every write to memories, so a cache in any process can tell in one read
-- whether the rows it holds are still current (A3).
CREATE TABLE memory_changes (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    counter INTEGER NOT NULL
);
INSERT INTO memory_changes (id, counter) VALUES (1, 0);
CREATE TRIGGER memories_count_ai AFTER INSERT ON memories BEGIN
    UPDATE memory_changes SET counter = counter + 1 WHERE id = 1;
END;
CREATE TRIGGER memories_count_au AFTER UPDATE ON memories BEGIN
    UPDATE memory_changes SET counter = counter + 1 WHERE id = 1;
END;
CREATE TRIGGER memories_count_ad AFTER DELETE ON memories BEGIN
    UPDATE memory_changes SET counter = counter + 1 WHERE id = 1;
END;

-- migration 3: index for rendering the prompt files
-- Rendering reads the newest live rows of one section (agent, owner, scope, category);
-- this index serves that read without walking the whole scope (bench/prompt.py: 135 ms
-- -> 42 ms for a rebuild at 10,000 rows).
CREATE INDEX memories_render ON memories
    (agent_id, owner_id, scope_type, scope_id, category, updated_at DESC, id DESC)
    WHERE archived_at IS NULL;

-- migration 4: a change counter per conversation window
-- Bumped by every message stored in a conversation and by every move of its window (a
-- compaction's checkpoint, /new, /clear), whichever process commits it: a window cached in
-- any process tells in one primary-key read whether it is still current (M4). Nothing else
-- moves it (a touch of owner or trust, the review and compaction gates), so other writes
-- never make a cache reload. Messages are never edited or deleted by fermix; should SQL
-- from outside do it, the counter moves too and the caches read their windows again.
ALTER TABLE conversations ADD COLUMN window_version INTEGER NOT NULL DEFAULT 0;
-- Backfill: one count per stored message, so the counter never goes back on an upgrade.
UPDATE conversations SET window_version = (
    SELECT count(*) FROM messages AS m
     WHERE m.agent_id = conversations.agent_id AND m.channel = conversations.channel
       AND m.chat_id = conversations.chat_id AND m.thread_scope = conversations.thread_scope
);
CREATE TRIGGER messages_window_ai AFTER INSERT ON messages BEGIN
    UPDATE conversations SET window_version = window_version + 1
     WHERE agent_id = new.agent_id AND channel = new.channel AND chat_id = new.chat_id
       AND thread_scope = new.thread_scope;
END;
CREATE TRIGGER messages_window_au AFTER UPDATE ON messages BEGIN
    UPDATE conversations SET window_version = window_version + 1
     WHERE agent_id = old.agent_id AND channel = old.channel AND chat_id = old.chat_id
       AND thread_scope = old.thread_scope;
    UPDATE conversations SET window_version = window_version + 1
     WHERE agent_id = new.agent_id AND channel = new.channel AND chat_id = new.chat_id
       AND thread_scope = new.thread_scope;
END;
CREATE TRIGGER messages_window_ad AFTER DELETE ON messages BEGIN
    UPDATE conversations SET window_version = window_version + 1
     WHERE agent_id = old.agent_id AND channel = old.channel AND chat_id = old.chat_id
       AND thread_scope = old.thread_scope;
END;
CREATE TRIGGER conversations_window_au
    AFTER UPDATE OF window_after_id, checkpoint_message_id ON conversations
    WHEN old.window_after_id IS NOT new.window_after_id
      OR old.checkpoint_message_id IS NOT new.checkpoint_message_id
BEGIN
    UPDATE conversations SET window_version = window_version + 1
     WHERE agent_id = new.agent_id AND channel = new.channel AND chat_id = new.chat_id
       AND thread_scope = new.thread_scope;
END;

-- migration 5: who wrote each message, and with what trust (M1, M2)
-- A message records its author's trust beside its author (owner_id), so a review admits
-- each fact with the trust of the person who said it, not with the conversation's last
-- writer's. Backfill: every stored message takes the trust its conversation had when this
-- migration ran, so a database written before keeps its meaning (a message of a
-- conversation without a row, which fermix never writes, is a guest's: least privilege).
-- The backfill moves no window (M4): migration 4's update trigger is set aside for it and
-- created again, unchanged, in the same transaction.
ALTER TABLE messages ADD COLUMN trust TEXT NOT NULL DEFAULT 'guest'
    CHECK (trust IN ('operator', 'guest'));
DROP TRIGGER messages_window_au;
UPDATE messages SET trust = 'operator' WHERE EXISTS (
    SELECT 1 FROM conversations AS c
     WHERE c.agent_id = messages.agent_id AND c.channel = messages.channel
       AND c.chat_id = messages.chat_id AND c.thread_scope = messages.thread_scope
       AND c.trust = 'operator'
);
CREATE TRIGGER messages_window_au AFTER UPDATE ON messages BEGIN
    UPDATE conversations SET window_version = window_version + 1
     WHERE agent_id = old.agent_id AND channel = old.channel AND chat_id = old.chat_id
       AND thread_scope = old.thread_scope;
    UPDATE conversations SET window_version = window_version + 1
     WHERE agent_id = new.agent_id AND channel = new.channel AND chat_id = new.chat_id
       AND thread_scope = new.thread_scope;
END;

-- migration 6: bearer tokens of the memory server, and idempotent appends (N2, N3)
-- A token is stored as the SHA-256 of its secret only (the secret is shown once, when it
-- is created); its prefix names it in listings. A token acts for the agents it lists, and
-- as the operator only with operator = 1. Revoking sets revoked_at; the row stays, so a
-- listing shows what existed and when it ended.
CREATE TABLE api_tokens (
    id           INTEGER PRIMARY KEY,
    name         TEXT NOT NULL DEFAULT '',
    prefix       TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL UNIQUE,
    agents_json  TEXT NOT NULL,
    operator     INTEGER NOT NULL DEFAULT 0 CHECK (operator IN (0, 1)),
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
);
-- A client's own key for a message: a retried append with the same key in the same
-- conversation is stored once (N3). Messages appended without one are not in the index.
ALTER TABLE messages ADD COLUMN client_key TEXT;
CREATE UNIQUE INDEX messages_client_key
    ON messages (agent_id, channel, chat_id, thread_scope, client_key)
    WHERE client_key IS NOT NULL;

-- migration 7: search bounded by the scope searched (issue 14)
-- Every message is indexed with two scope tokens beside its text: one for its conversation
-- ("c" and the hex of agent, channel, chat and thread, each part ended by "x") and one for
-- its author's owner scope ("o" and the hex of agent and owner). A search of one
-- conversation or of one owner matches 'search_scope : "<token>" AND content : (words)',
-- so FTS5 walks the scope's own doclist and seeks the words' doclists to its rows instead
-- of matching every message of the table (bench/recall.py, 1,000,000 messages: see
-- fermix/storage/messages.py). The tokens are text of the row itself, so they cost no
-- bytes in messages (a virtual generated column) and any writer, fermix's or SQL from
-- outside, keeps them right through the triggers. Hex keeps any id one unicode61 token;
-- the closing "z" keeps porter from stemming it. The SQL filter on the row's columns
-- stays in every search, so a token is only ever an accelerator, never the rule.
-- The mirror is built again from its content (one 'rebuild'), with the triggers it had
-- plus the token column; an update of any column a token is made of re-indexes the row.
ALTER TABLE messages ADD COLUMN search_scope TEXT GENERATED ALWAYS AS (
    'c' || hex(agent_id) || 'x' || hex(channel) || 'x' || hex(chat_id) || 'x'
        || hex(thread_scope) || 'z o' || hex(agent_id) || 'x' || hex(owner_id) || 'z'
) VIRTUAL;
DROP TRIGGER messages_ai;
DROP TRIGGER messages_ad;
DROP TRIGGER messages_au;
DROP TABLE messages_fts;
CREATE VIRTUAL TABLE messages_fts USING fts5 (
    content,
    search_scope,
    content = 'messages',
    content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
INSERT INTO messages_fts (messages_fts) VALUES ('rebuild');
CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, content, search_scope)
        VALUES (new.id, new.content, new.search_scope);
END;
CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content, search_scope)
        VALUES ('delete', old.id, old.content, old.search_scope);
END;
CREATE TRIGGER messages_au
    AFTER UPDATE OF content, agent_id, owner_id, channel, chat_id, thread_scope ON messages
BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content, search_scope)
        VALUES ('delete', old.id, old.content, old.search_scope);
    INSERT INTO messages_fts (rowid, content, search_scope)
        VALUES (new.id, new.content, new.search_scope);
END;

-- migration 8: vectors for recall, beside their rows (issue 14, Q2)
-- A message's or memory row's vector is computed in the background after it is stored
-- (fermix/runtime/embedding.py), never on the acknowledged path: a row without one is still
-- found by full-text search. Vectors are int8, one BLOB per row, read by the rows of the
-- scope searched (a conversation's index, an owner's FTS token), never the whole table.
-- embedding_model records the model and dimension the vectors are of: one row, replaced
-- when the configured model changes, and then every vector is computed again.
-- embedding_tokens counts the tokens of each scope's embedded texts (a conversation's
-- messages, an agent's memory rows): the offline model weighs a token by its rarity there.
-- Editing a row's text drops its vector, so it is embedded again.
CREATE TABLE embedding_model (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    model       TEXT NOT NULL,
    dim         INTEGER NOT NULL CHECK (dim > 0),
    recorded_at INTEGER NOT NULL
);
CREATE TABLE message_vectors (
    message_id INTEGER PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    vector     BLOB NOT NULL
);
CREATE TABLE memory_vectors (
    memory_id INTEGER PRIMARY KEY REFERENCES memories (id) ON DELETE CASCADE,
    vector    BLOB NOT NULL
);
CREATE TABLE embedding_scopes (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
-- token -1 holds the scope's total.
CREATE TABLE embedding_tokens (
    scope_id INTEGER NOT NULL REFERENCES embedding_scopes (id) ON DELETE CASCADE,
    token    INTEGER NOT NULL,
    count    INTEGER NOT NULL,
    PRIMARY KEY (scope_id, token)
) WITHOUT ROWID;
CREATE TRIGGER message_vectors_au AFTER UPDATE OF content ON messages BEGIN
    DELETE FROM message_vectors WHERE message_id = new.id;
END;
CREATE TRIGGER memory_vectors_au AFTER UPDATE OF key, value ON memories BEGIN
    DELETE FROM memory_vectors WHERE memory_id = new.id;
END;

-- migration 9: conversations due for a review, found without a scan (issue 15, M7)
-- review_due_at is since when a user message waits for a review (NULL: none waits). The
-- insert of a user message sets it, if it is not set, in the update of the window's
-- counter (migration 4's trigger, one statement as before); a review that catches up
-- clears it, one that leaves part of the backlog keeps it (M5: due again at once). The
-- sweep then reads the due conversations, oldest first, off a partial index, instead of
-- joining every conversation with its messages. The same column and index as PostgreSQL's
-- (fermix/storage/pg/schema.sql). Backfill: the oldest waiting user message's time.
ALTER TABLE conversations ADD COLUMN review_due_at INTEGER;
UPDATE conversations SET review_due_at = (
    SELECT min(m.created_at) FROM messages AS m
     WHERE m.agent_id = conversations.agent_id AND m.channel = conversations.channel
       AND m.chat_id = conversations.chat_id AND m.thread_scope = conversations.thread_scope
       AND m.role = 'user' AND m.id > conversations.last_reviewed_message_id
);
CREATE INDEX conversations_due ON conversations (review_due_at)
    WHERE review_due_at IS NOT NULL;
DROP TRIGGER messages_window_ai;
CREATE TRIGGER messages_window_ai AFTER INSERT ON messages BEGIN
    UPDATE conversations
       SET window_version = window_version + 1,
           review_due_at = CASE WHEN new.role = 'user'
                                THEN coalesce(review_due_at, new.created_at)
                                ELSE review_due_at END
     WHERE agent_id = new.agent_id AND channel = new.channel AND chat_id = new.chat_id
       AND thread_scope = new.thread_scope;
END;

-- migration 10: forgetting (issue 22, F1-F5)
-- erasures records each erasure from its start, so that a killed one is finished by the
-- next start or the same call again (F5), and keeps it afterwards as the audit record:
-- what was erased (target, agent, counts), when, and at whose request, with the subject (an
-- owner id, a conversation's key, a row's id) only while it runs; once its rows are gone
-- only subject_key, a keyed hash of it under audit_secret's key, is kept. state: 'running'
-- (rows left), 'pending' (rows gone, a copy on disk left: a reader holds the log back),
-- 'done' (F3). The indexes find an owner's rows without a scan; FTS5's secure-delete
-- removes a deleted row's terms from the index segments at once, instead of leaving them
-- until a merge (the connection's PRAGMA secure_delete zeroes freed cells and pages).
CREATE TABLE erasures (
    id           INTEGER PRIMARY KEY,
    target       TEXT NOT NULL CHECK (target IN ('owner', 'conversation', 'message', 'memory')),
    agent_id     TEXT,
    subject      TEXT,
    subject_key  TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('running', 'pending', 'done')),
    counts_json  TEXT NOT NULL DEFAULT '{}',
    work_json    TEXT NOT NULL DEFAULT '{}',
    started_at   INTEGER NOT NULL,
    finished_at  INTEGER
);
CREATE INDEX erasures_unfinished ON erasures (state) WHERE state <> 'done';
CREATE TABLE audit_secret (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    secret TEXT NOT NULL
);
CREATE INDEX messages_author ON messages (owner_id, agent_id, id);
CREATE INDEX conversations_owner ON conversations (owner_id, agent_id);
CREATE INDEX memories_owner ON memories (owner_id, agent_id);
CREATE INDEX memories_source_message ON memories (source_message_id)
    WHERE source_message_id IS NOT NULL;
INSERT INTO messages_fts (messages_fts, rank) VALUES ('secure-delete', 1);
INSERT INTO memories_fts (memories_fts, rank) VALUES ('secure-delete', 1);

-- migration 11: the outcome and reason of each conversation's last review and compaction
-- (issue 24, W1): what the operator's console shows for a review or compaction that ran (or
-- could not run for want of a model), never a routine gate's skip. A reason is a short code
-- with the model and error class: never message text nor a secret (fermix/model.py).
ALTER TABLE conversations ADD COLUMN review_outcome TEXT;
ALTER TABLE conversations ADD COLUMN review_reason TEXT;
ALTER TABLE conversations ADD COLUMN review_outcome_at INTEGER;
ALTER TABLE conversations ADD COLUMN compaction_outcome TEXT;
ALTER TABLE conversations ADD COLUMN compaction_reason TEXT;
ALTER TABLE conversations ADD COLUMN compaction_outcome_at INTEGER;

-- migration 12: an append writes the due index only when it makes its conversation due
-- messages_window_ai set review_due_at on every insert, to its own value once a user
-- message waited: SQLite rewrites an index entry whenever an UPDATE sets its column, so
-- each append wrote a page of conversations_due to the log, one of its 12 (issue 25: the
-- appends of bench/peers.py took 5% longer, their time until searchable 8%). The due
-- time is now set by a statement of its own, only while there is none.
DROP TRIGGER messages_window_ai;
CREATE TRIGGER messages_window_ai AFTER INSERT ON messages BEGIN
    UPDATE conversations SET window_version = window_version + 1
     WHERE agent_id = new.agent_id AND channel = new.channel AND chat_id = new.chat_id
       AND thread_scope = new.thread_scope;
    UPDATE conversations SET review_due_at = new.created_at
     WHERE agent_id = new.agent_id AND channel = new.channel AND chat_id = new.chat_id
       AND thread_scope = new.thread_scope AND new.role = 'user' AND review_due_at IS NULL;
END;

-- migration 13: an owner's messages read in conversation order by an index (issue 25)
-- A hybrid search of an owner's history reads every message of the owner (their
-- conversation, sender and time) with its vector, by conversation, time and id
-- (fermix/storage/sqlite/vectors.py). It read them through the owner's FTS5 scope token,
-- looked each row up, and sorted them in Python: bench/recall.py's owner search at
-- 1,000,000 messages (2,500 rows an owner, conversations interleaved in the rowid space)
-- spent 4.8 ms of CPU there at p50, against 2.6 ms by this index, which holds every
-- column the read takes of a message in the order it wants (no lookup, no sort). (The
-- owner's count is plain SQL now, on whichever index SQLite picks.) An append writes one
-- more index page to the log (12 a commit against 11): fermix's SQLite append of LoCoMo's
-- 2,760 turns, ten rounds alternated with the index dropped, took a median 155 against
-- 148 us.
CREATE INDEX messages_owner_order
    ON messages (agent_id, owner_id, channel, chat_id, thread_scope, created_at, id, sender);
