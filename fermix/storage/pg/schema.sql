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
SELECT 1;

-- migration 3: sources, scheduled jobs and their runs
SELECT 1;

-- migration 4: vectors for recall
SELECT 1;
