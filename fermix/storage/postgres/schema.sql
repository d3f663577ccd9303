-- fermix schema on PostgreSQL, as numbered migrations (docs/postgres.md, issue 15).
--
-- Each block starts with a line "-- migration N: name" and runs in its own transaction,
-- under a transaction-level advisory lock (fermix/storage/pg/migrations.py), together with
-- its row in schema_migrations. Never edit a released block: add a new one. Times are
-- integer milliseconds since the epoch (bigint), ids bigint, JSON text, booleans smallint
-- checked to 0 or 1: a row reads back as the same tuple as on SQLite.
--
-- First slice of the adapter: conversations, messages (with their search stems) and the
-- bearer tokens. The other table families come in later migrations.

-- migration 1: conversations, messages with their search stems, bearer tokens
CREATE TABLE conversations (
    agent_id                 text NOT NULL,
    channel                  text NOT NULL,
    chat_id                  text NOT NULL,
    thread_scope             text NOT NULL DEFAULT '',
    owner_id                 text NOT NULL DEFAULT '',
    trust                    text NOT NULL DEFAULT 'operator' CHECK (trust IN ('operator', 'guest')),
    window_after_id          bigint NOT NULL DEFAULT 0,
    checkpoint_message_id    bigint,
    last_reviewed_at         bigint,
    last_reviewed_message_id bigint NOT NULL DEFAULT 0,
    review_failed_at         bigint,
    review_claim_token       text,
    review_claim_expires_at  bigint,
    peak_prompt_tokens       bigint,
    compaction_failed_at     bigint,
    created_at               bigint NOT NULL,
    updated_at               bigint NOT NULL,
    -- Moved by every message stored in the conversation and every move of its window (M4).
    window_version           bigint NOT NULL DEFAULT 0,
    -- Since when a user message waits for a review (NULL: none): the sweep's index.
    review_due_at            bigint,
    PRIMARY KEY (agent_id, channel, chat_id, thread_scope)
);
CREATE INDEX conversations_due ON conversations (review_due_at) WHERE review_due_at IS NOT NULL;

-- The id is drawn by messages_bi once the conversation's row is locked, so within one
-- conversation ids commit in order (a reader at id n never misses an id below n later).
CREATE SEQUENCE messages_id_seq;
CREATE TABLE messages (
    id            bigint PRIMARY KEY,
    agent_id      text NOT NULL,
    owner_id      text NOT NULL DEFAULT '',
    channel       text NOT NULL,
    chat_id       text NOT NULL,
    thread_scope  text NOT NULL DEFAULT '',
    sender        text NOT NULL DEFAULT '',
    role          text NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    kind          text NOT NULL DEFAULT 'chat',
    content       text NOT NULL,
    metadata_json text NOT NULL DEFAULT '{}',
    created_at    bigint NOT NULL,
    trust         text NOT NULL DEFAULT 'guest' CHECK (trust IN ('operator', 'guest')),
    client_key    text,
    -- The SQLite FTS5 tokenizer's stems of content, with positions, and the two scope
    -- lexemes ('#c...z', '#o...z'), computed by the writer (fermix/storage/pg/stems.py).
    stems         tsvector NOT NULL
);
ALTER SEQUENCE messages_id_seq OWNED BY messages.id;
CREATE INDEX messages_conversation
    ON messages (agent_id, channel, chat_id, thread_scope, created_at, id);
CREATE UNIQUE INDEX messages_client_key
    ON messages (agent_id, channel, chat_id, thread_scope, client_key)
    WHERE client_key IS NOT NULL;
CREATE INDEX messages_owner ON messages (agent_id, owner_id, id);
CREATE INDEX messages_stems ON messages USING gin (stems) WITH (fastupdate = off);
ALTER TABLE conversations ADD CONSTRAINT conversations_checkpoint
    FOREIGN KEY (checkpoint_message_id) REFERENCES messages (id);

CREATE FUNCTION messages_bi() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE conversations
       SET window_version = window_version + 1,
           review_due_at = CASE WHEN NEW.role = 'user'
                                THEN coalesce(review_due_at, NEW.created_at)
                                ELSE review_due_at END
     WHERE agent_id = NEW.agent_id AND channel = NEW.channel AND chat_id = NEW.chat_id
       AND thread_scope = NEW.thread_scope;
    IF NEW.id IS NULL THEN
        NEW.id := nextval('messages_id_seq');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER messages_bi BEFORE INSERT ON messages
    FOR EACH ROW EXECUTE FUNCTION messages_bi();

-- SQL from outside fermix that edits or deletes messages moves the windows too (M4).
CREATE FUNCTION messages_window_aud() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE conversations SET window_version = window_version + 1
     WHERE agent_id = OLD.agent_id AND channel = OLD.channel AND chat_id = OLD.chat_id
       AND thread_scope = OLD.thread_scope;
    IF TG_OP = 'UPDATE' THEN
        UPDATE conversations SET window_version = window_version + 1
         WHERE agent_id = NEW.agent_id AND channel = NEW.channel AND chat_id = NEW.chat_id
           AND thread_scope = NEW.thread_scope;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER messages_window_aud AFTER UPDATE OR DELETE ON messages
    FOR EACH ROW EXECUTE FUNCTION messages_window_aud();

CREATE FUNCTION conversations_window_bu() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.window_after_id IS DISTINCT FROM OLD.window_after_id
       OR NEW.checkpoint_message_id IS DISTINCT FROM OLD.checkpoint_message_id THEN
        NEW.window_version := NEW.window_version + 1;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER conversations_window_bu BEFORE UPDATE ON conversations
    FOR EACH ROW EXECUTE FUNCTION conversations_window_bu();

CREATE TABLE api_tokens (
    id            bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    name          text NOT NULL DEFAULT '',
    prefix        text NOT NULL,
    secret_sha256 text NOT NULL UNIQUE,
    agents_json   text NOT NULL,
    operator      smallint NOT NULL DEFAULT 0 CHECK (operator IN (0, 1)),
    created_at    bigint NOT NULL,
    revoked_at    bigint
);

-- migration 2: memory rows, their change counters, prompt-file resources and revisions
-- SQLite's memories (S5, S7) with their search stems beside them instead of an FTS5
-- mirror: the FTS5 tokenizer's tokens of key, then of value one position apart, written
-- by fermix/storage/pg/memories.py (no scope lexemes: memories_fts has none), and how many
-- tokens the two hold (FTS5's column sizes, which its bm25() weighs). A writer other than
-- fermix must fill both. memories.source_id gets its foreign key with memory_sources
-- (migration 3).
CREATE TABLE memories (
    id                 bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    agent_id           text NOT NULL,
    owner_id           text NOT NULL DEFAULT '',
    scope_type         text NOT NULL CHECK (scope_type IN ('owner', 'agent', 'conversation', 'job')),
    scope_id           text NOT NULL,
    category           text NOT NULL CHECK (category IN
                           ('identity', 'preference', 'interest', 'goal', 'context', 'directive')),
    key                text NOT NULL,
    value              text NOT NULL,
    confidence         double precision NOT NULL DEFAULT 1.0,
    promote_target     text CHECK (promote_target IN ('user_md', 'memory_md')),
    source_id          bigint,
    source_type        text,
    source_name        text,
    source_description text,
    session_id         text,
    run_id             bigint,
    source_message_id  bigint,
    archived_at        bigint,
    archived_by        text,
    archive_reason     text,
    created_at         bigint NOT NULL,
    updated_at         bigint NOT NULL,
    stems              tsvector NOT NULL,
    stem_count         integer NOT NULL CHECK (stem_count >= 0),
    UNIQUE (agent_id, owner_id, scope_type, scope_id, key)
);
CREATE INDEX memories_scope ON memories (agent_id, scope_type, scope_id, archived_at);
CREATE INDEX memories_render ON memories
    (agent_id, owner_id, scope_type, scope_id, category, updated_at DESC, id DESC)
    WHERE archived_at IS NULL;
CREATE INDEX memories_stems ON memories USING gin (stems) WITH (fastupdate = off);

-- SQLite's memory_changes is one row every memory write updates: here a row lock every
-- write of every service would queue on. One row per (agent, owner) instead, moved by
-- every insert, update and delete of one of its rows, whoever writes it (A3):
-- memory_version(agent, owner) reads the sum of (agent, owner) and (agent, ''), whose
-- rows show in every owner's prompt files. The same rows count the table's rows and
-- tokens for the search ranking (FTS5's bm25() takes them over the whole table).
CREATE TABLE memory_versions (
    agent_id    text NOT NULL,
    owner_id    text NOT NULL,
    version     bigint NOT NULL,
    row_count   bigint NOT NULL,
    token_count bigint NOT NULL,
    PRIMARY KEY (agent_id, owner_id)
);

CREATE FUNCTION memories_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.agent_id = OLD.agent_id AND NEW.owner_id = OLD.owner_id THEN
        UPDATE memory_versions
           SET version = version + 1, token_count = token_count + NEW.stem_count - OLD.stem_count
         WHERE agent_id = NEW.agent_id AND owner_id = NEW.owner_id;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE memory_versions
           SET version = version + 1, row_count = row_count - 1,
               token_count = token_count - OLD.stem_count
         WHERE agent_id = OLD.agent_id AND owner_id = OLD.owner_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO memory_versions AS v (agent_id, owner_id, version, row_count, token_count)
        VALUES (NEW.agent_id, NEW.owner_id, 1, 1, NEW.stem_count)
        ON CONFLICT (agent_id, owner_id) DO UPDATE
           SET version = v.version + 1, row_count = v.row_count + 1,
               token_count = v.token_count + excluded.token_count;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_count AFTER INSERT OR UPDATE OR DELETE ON memories
    FOR EACH ROW EXECUTE FUNCTION memories_count();

-- TRUNCATE fires no row trigger: the counts go to zero, and every version moves.
CREATE FUNCTION memories_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE memory_versions SET version = version + 1, row_count = 0, token_count = 0;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_truncated AFTER TRUNCATE ON memories
    FOR EACH STATEMENT EXECUTE FUNCTION memories_truncated();

-- A resource is one prompt file of one agent for one owner ('' is the agent's default
-- owner), P2. Its revisions are numbered under its row lock (fermix/storage/pg/resources.py).
CREATE TABLE resources (
    id               bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    agent_id         text NOT NULL,
    owner_id         text NOT NULL DEFAULT '',
    name             text NOT NULL CHECK (name IN ('user_md', 'memory_md')),
    current_revision bigint NOT NULL DEFAULT 0,
    updated_at       bigint NOT NULL,
    UNIQUE (agent_id, owner_id, name)
);

CREATE TABLE resource_revisions (
    id           bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    resource_id  bigint NOT NULL REFERENCES resources (id) ON DELETE CASCADE,
    revision     bigint NOT NULL,
    content      text NOT NULL,
    content_sha1 text NOT NULL,
    reason       text NOT NULL,
    created_at   bigint NOT NULL,
    UNIQUE (resource_id, revision)
);

-- migration 3: sources, scheduled jobs and their runs
-- SQLite's tables of migration 1 (S6, SC1), ids from identities (fermix/storage/pg/jobs.py
-- never tries an insert that would conflict, so no id is spent on one).
CREATE TABLE memory_sources (
    id          bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    agent_id    text NOT NULL,
    owner_id    text NOT NULL DEFAULT '',
    source_type text NOT NULL CHECK (source_type IN ('conversation', 'job', 'realtime', 'operator')),
    name        text NOT NULL,
    description text NOT NULL DEFAULT '',
    created_at  bigint NOT NULL,
    UNIQUE (agent_id, source_type, name)
);

CREATE TABLE scheduled_jobs (
    id               bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    agent_id         text NOT NULL,
    owner_id         text NOT NULL DEFAULT '',
    name             text NOT NULL,
    schedule         text NOT NULL,
    prompt           text NOT NULL,
    memory_source_id bigint NOT NULL REFERENCES memory_sources (id),
    enabled          smallint NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    next_run_at      bigint,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    UNIQUE (agent_id, name)
);

CREATE TABLE job_runs (
    id          bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    job_id      bigint NOT NULL REFERENCES scheduled_jobs (id) ON DELETE CASCADE,
    status      text NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
    output      text NOT NULL DEFAULT '',
    error       text,
    started_at  bigint NOT NULL,
    finished_at bigint
);
-- The newest runs of a job (list_runs: started_at DESC, id DESC) straight from the index.
CREATE INDEX job_runs_job ON job_runs (job_id, started_at, id);

-- memories.source_id (migration 2) references its source, as on SQLite: the table it
-- points to exists only from here on.
ALTER TABLE memories ADD CONSTRAINT memories_source
    FOREIGN KEY (source_id) REFERENCES memory_sources (id) ON DELETE SET NULL;

-- migration 4: vectors for recall
-- SQLite's migration 8 (fermix/storage/vectors.py): one int8 bytea per row, beside it,
-- deleted with it and when its text changes; the embedded texts' token counts per scope;
-- the recorded model. Where pgvector can be had, recording a model also makes
-- message_ann, the approximate index (fermix/storage/pg/vectors.py): not here, since its
-- type needs the extension and its dimension the model.
CREATE TABLE embedding_model (
    id          bigint PRIMARY KEY CHECK (id = 1),
    model       text NOT NULL,
    dim         bigint NOT NULL CHECK (dim > 0),
    recorded_at bigint NOT NULL
);
CREATE TABLE message_vectors (
    message_id bigint PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    vector     bytea NOT NULL
);
CREATE TABLE memory_vectors (
    memory_id bigint PRIMARY KEY REFERENCES memories (id) ON DELETE CASCADE,
    vector    bytea NOT NULL
);
CREATE TABLE embedding_scopes (
    id   bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE
);
-- token -1 holds the scope's total.
CREATE TABLE embedding_tokens (
    scope_id bigint NOT NULL REFERENCES embedding_scopes (id) ON DELETE CASCADE,
    token    bigint NOT NULL,
    count    bigint NOT NULL,
    PRIMARY KEY (scope_id, token)
);

-- A message's text changed: its vector goes (it is embedded again). So does it when its
-- conversation or owner changes, which SQLite keeps: message_ann holds copies of them.
CREATE FUNCTION message_vectors_au() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM message_vectors WHERE message_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER message_vectors_au
    AFTER UPDATE OF content, agent_id, owner_id, channel, chat_id, thread_scope ON messages
    FOR EACH ROW EXECUTE FUNCTION message_vectors_au();

CREATE FUNCTION memory_vectors_au() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_vectors WHERE memory_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER memory_vectors_au AFTER UPDATE OF key, value ON memories
    FOR EACH ROW EXECUTE FUNCTION memory_vectors_au();

-- migration 5: forgetting (issue 22, F1-F5)
-- SQLite's migration 10: the erasure records (the audit afterwards, the subject only while
-- one runs), the key of their hashes, and the indexes that find an owner's rows.
CREATE TABLE erasures (
    id           bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    target       text NOT NULL CHECK (target IN ('owner', 'conversation', 'message', 'memory')),
    agent_id     text,
    subject      text,
    subject_key  text NOT NULL,
    requested_by text NOT NULL,
    state        text NOT NULL CHECK (state IN ('running', 'pending', 'done')),
    counts_json  text NOT NULL DEFAULT '{}',
    work_json    text NOT NULL DEFAULT '{}',
    started_at   bigint NOT NULL,
    finished_at  bigint
);
CREATE INDEX erasures_unfinished ON erasures (state) WHERE state <> 'done';
CREATE TABLE audit_secret (
    id     bigint PRIMARY KEY CHECK (id = 1),
    secret text NOT NULL
);
CREATE INDEX messages_author ON messages (owner_id, agent_id, id);
CREATE INDEX conversations_owner ON conversations (owner_id, agent_id);
CREATE INDEX memories_owner ON memories (owner_id, agent_id);
CREATE INDEX memories_source_message ON memories (source_message_id)
    WHERE source_message_id IS NOT NULL;
-- The per-(agent, owner) change counters move by a sequence, not by one: a counter made
-- again after its owner was erased (its row then renamed to name nobody, F1) starts above
-- every version any cache may hold, so no cache is served a version twice.
CREATE SEQUENCE memory_version_seq;
SELECT setval('memory_version_seq', coalesce((SELECT max(version) FROM memory_versions), 0) + 1);
CREATE OR REPLACE FUNCTION memories_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.agent_id = OLD.agent_id AND NEW.owner_id = OLD.owner_id THEN
        UPDATE memory_versions
           SET version = nextval('memory_version_seq'),
               token_count = token_count + NEW.stem_count - OLD.stem_count
         WHERE agent_id = NEW.agent_id AND owner_id = NEW.owner_id;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE memory_versions
           SET version = nextval('memory_version_seq'), row_count = row_count - 1,
               token_count = token_count - OLD.stem_count
         WHERE agent_id = OLD.agent_id AND owner_id = OLD.owner_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO memory_versions AS v (agent_id, owner_id, version, row_count, token_count)
        VALUES (NEW.agent_id, NEW.owner_id, nextval('memory_version_seq'), 1, NEW.stem_count)
        ON CONFLICT (agent_id, owner_id) DO UPDATE
           SET version = nextval('memory_version_seq'), row_count = v.row_count + 1,
               token_count = v.token_count + excluded.token_count;
    END IF;
    RETURN NULL;
END $$;

-- migration 6: the outcome and reason of each conversation's last review and compaction
-- SQLite's migration 11 (issue 24, W1): short codes, never message text nor a secret.
ALTER TABLE conversations
    ADD COLUMN review_outcome text,
    ADD COLUMN review_reason text,
    ADD COLUMN review_outcome_at bigint,
    ADD COLUMN compaction_outcome text,
    ADD COLUMN compaction_reason text,
    ADD COLUMN compaction_outcome_at bigint;

-- migration 7: each conversation's latest message time, kept by messages_bi
-- A message's time is now but not before its conversation's latest (fermix/storage/
-- postgres/messages.py). It was max(created_at) over the conversation's messages, which
-- a cached generic plan made while the table was new could read by messages_owner, every
-- message of the agent for each insert (issue 25: 7 ms an append at 18,000 messages, and
-- growing). Now it is one column of the conversation's row, which the insert has locked:
-- a primary-key lookup, whatever the plan. Erasing messages leaves it as it was: times
-- stay in id order.
ALTER TABLE conversations ADD COLUMN latest_message_at bigint;
UPDATE conversations AS c
   SET latest_message_at = m.latest
  FROM (SELECT agent_id, channel, chat_id, thread_scope, max(created_at) AS latest
          FROM messages GROUP BY agent_id, channel, chat_id, thread_scope) AS m
 WHERE c.agent_id = m.agent_id AND c.channel = m.channel AND c.chat_id = m.chat_id
   AND c.thread_scope = m.thread_scope;
CREATE OR REPLACE FUNCTION messages_bi() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE conversations
       SET window_version = window_version + 1,
           review_due_at = CASE WHEN NEW.role = 'user'
                                THEN coalesce(review_due_at, NEW.created_at)
                                ELSE review_due_at END,
           latest_message_at = greatest(latest_message_at, NEW.created_at)
     WHERE agent_id = NEW.agent_id AND channel = NEW.channel AND chat_id = NEW.chat_id
       AND thread_scope = NEW.thread_scope;
    IF NEW.id IS NULL THEN
        NEW.id := nextval('messages_id_seq');
    END IF;
    RETURN NEW;
END $$;
