-- The SQLite store's schema, one named block per statement (schema_*), loaded by name
-- (chongming_task.stores.sql.load_named) and run in file order inside one BEGIN
-- IMMEDIATE by the migration (schema.py). Column lists follow chongming_task.stores.codec
-- (a test compares them with the tables made here). The statements the store runs are
-- in queries.sql.

-- seq is the task's place in the order tasks were made here: the trail is kept in that
-- order (below). INTEGER PRIMARY KEY, so it is the rowid and no VACUUM renumbers it.
-- name: schema_tasks
CREATE TABLE IF NOT EXISTS tasks (
    seq               INTEGER PRIMARY KEY,
    task_id           TEXT NOT NULL UNIQUE,
    name              TEXT NOT NULL,
    status            TEXT NOT NULL,
    status_version    INTEGER NOT NULL,
    attempt           INTEGER NOT NULL,
    tags              TEXT NOT NULL,
    bucket            INTEGER,
    bucket_key        TEXT,
    pipeline_run_id   TEXT,
    owner             TEXT,
    created_at        TEXT NOT NULL,
    started_at        TEXT,
    ended_at          TEXT,
    last_heartbeat_at TEXT,
    progress          TEXT,
    failure           TEXT,
    lease_owner       TEXT,
    lease_until       TEXT,
    run_at            TEXT,
    priority          INTEGER NOT NULL DEFAULT 0,
    dedupe_key        TEXT,
    dedupe_window     REAL,
    concurrency_key   TEXT,
    trace_context     TEXT,
    -- A result longer than roles.PREVIEW (4000) characters of JSON text: its first 4001,
    -- so a reader can show its start, and tell it was cut, without reading the whole.
    outcome_preview   TEXT GENERATED ALWAYS AS (
        CASE WHEN length(outcome) > 4000 THEN substr(outcome, 1, 4001) END
    ) STORED,
    -- Last (schema 16): a large value spills into a chain of overflow pages, and SQLite
    -- walks that chain to reach any column after it (12 ms for 50 MB); before every
    -- other column, it cost each read of the row that.
    outcome           TEXT
)

-- name: schema_idx_tasks_status
CREATE INDEX IF NOT EXISTS idx_tasks_status ON tasks (status)

-- Tasks with a bucket only (schema 9): most stores hold none, and a create wrote the
-- index's right edge for nothing (1.2 of the 17.6 pages a per-call task wrote). A
-- bucket = / IN still finds it (each implies NOT NULL); bucket_totals counts the rest.
-- name: schema_idx_tasks_bucket
CREATE INDEX IF NOT EXISTS idx_tasks_bucket ON tasks (bucket) WHERE bucket IS NOT NULL

-- name: schema_idx_tasks_created_at
CREATE INDEX IF NOT EXISTS idx_tasks_created_at ON tasks (created_at)

-- One node's tasks, newest first (the dashboard's and ps's node filter). owner is fixed
-- at create, so only a create writes this index.
-- name: schema_idx_tasks_owner
CREATE INDEX IF NOT EXISTS idx_tasks_owner ON tasks (owner, created_at)

-- name: schema_idx_tasks_pipeline
CREATE INDEX IF NOT EXISTS idx_tasks_pipeline ON tasks (pipeline_run_id)
    WHERE pipeline_run_id IS NOT NULL

-- A dedupe key's tasks (schema 13): what a deduplicated create looks up, one probe.
-- name: schema_idx_tasks_dedupe
CREATE INDEX IF NOT EXISTS idx_tasks_dedupe ON tasks (dedupe_key)
    WHERE dedupe_key IS NOT NULL

-- The trail, kept in the order of its tasks' seq (schema 9): task ids are random, and
-- keyed by task_id a task's trail rows landed in a leaf anywhere in the tree, so each
-- commit wrote a leaf of its own for each task in it and split full ones (a per-call
-- task's commit wrote 7.0 trail pages; in seq order 3.4, its rows beside the newest
-- tasks': bench/sqlite_pages.py). A transition of a task not in tasks (appended before
-- its create, or after a prune) is a loose_transitions row (below) until its task is
-- made.
--
-- Since schema 11 a row's rowid is its key: seq * 16777216 + version (2^24 versions a
-- task, which CHECK holds to), so a task's trail is a rowid range and a commit's rows
-- are appends at the right edge of a rowid table, which SQLite balances the quick way:
-- keyed (seq, task_id, version) in a WITHOUT ROWID table, a per-call task wrote 3.2
-- trail pages, keyed by rowid 2.3 (bench/sqlite_pages.py). task_id stays in the row, and
-- every statement checks it beside the key. Writes are ON CONFLICT DO NOTHING, not OR
-- IGNORE: OR IGNORE would skip a row the CHECK refuses, without a word.
-- name: schema_transitions
CREATE TABLE IF NOT EXISTS transitions (
    key         INTEGER PRIMARY KEY,
    task_id     TEXT NOT NULL,
    version     INTEGER NOT NULL CHECK (version BETWEEN 0 AND 16777215),
    from_status TEXT,
    to_status   TEXT NOT NULL,
    at          TEXT NOT NULL,
    reason      TEXT,
    actor       TEXT
)

-- The trail of tasks this store does not hold (schema 10): appended before their create,
-- or after a prune. A create adopts its task's rows: moves them to transitions, under
-- its seq (task_writes_new; adopt_loose). Until schema 10 they waited in transitions
-- under seq 0, and the adoption was an UPDATE of that table's key, which SQLite runs in
-- two passes through a temporary table, rows found or not: 50k of the 419k instructions
-- a per-call task's commit took. From a table of its own, nearly always empty, it is
-- a lookup that finds nothing.
-- Its versions are held to the trail's range too (schema 11), so a row it takes can
-- always join its task.
-- name: schema_loose_transitions
CREATE TABLE IF NOT EXISTS loose_transitions (
    task_id     TEXT NOT NULL,
    version     INTEGER NOT NULL CHECK (version BETWEEN 0 AND 16777215),
    from_status TEXT,
    to_status   TEXT NOT NULL,
    at          TEXT NOT NULL,
    reason      TEXT,
    actor       TEXT,
    PRIMARY KEY (task_id, version)
) WITHOUT ROWID

-- name: schema_commands
CREATE TABLE IF NOT EXISTS commands (
    command_id  TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL,
    action      TEXT NOT NULL,
    issued_by   TEXT,
    created_at  TEXT NOT NULL,
    reason      TEXT,
    lease_until TEXT,
    finished_at TEXT,
    outcome     TEXT
)

-- name: schema_idx_commands_open
CREATE INDEX IF NOT EXISTS idx_commands_open ON commands (created_at)
    WHERE finished_at IS NULL

-- name: schema_idx_commands_pending
CREATE INDEX IF NOT EXISTS idx_commands_pending ON commands (task_id)
    WHERE finished_at IS NULL

-- name: schema_idx_commands_finished
CREATE INDEX IF NOT EXISTS idx_commands_finished ON commands (finished_at)
    WHERE finished_at IS NOT NULL

-- Node declarations (docs/design.md, "Fleet declarations"): who runs, which buckets each declares,
-- when each was last seen. For audit and alarms; nothing reads them to decide who runs
-- what. A node that declares no partition has all_buckets = 1 and no node_buckets rows.

-- name: schema_nodes
CREATE TABLE IF NOT EXISTS nodes (
    node        TEXT PRIMARY KEY,
    num_buckets INTEGER NOT NULL,
    all_buckets INTEGER NOT NULL,
    ttl_seconds REAL NOT NULL,
    started_at  TEXT NOT NULL,
    seen_at     TEXT NOT NULL,
    stopped_at  TEXT,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    health      TEXT
)

-- What a node reported of a task after the store had ended it without it (docs/design.md,
-- "Late truth"): a record beside the final status, never a change of it.
-- name: schema_late_reports
CREATE TABLE IF NOT EXISTS late_reports (
    task_id       TEXT PRIMARY KEY,
    reported_by   TEXT NOT NULL,
    reported_at   TEXT NOT NULL,
    status        TEXT NOT NULL,
    ended_at      TEXT,
    outcome       TEXT,
    failure       TEXT,
    stored_status TEXT NOT NULL
)

-- name: schema_idx_late_reports_at
CREATE INDEX IF NOT EXISTS idx_late_reports_at ON late_reports (reported_at)

-- Tasks a pause holds before they started (CommandChannel): their status stays queued.
-- name: schema_holds
CREATE TABLE IF NOT EXISTS holds (
    task_id TEXT PRIMARY KEY,
    since   TEXT NOT NULL,
    held_by TEXT NOT NULL
)

-- name: schema_node_buckets
CREATE TABLE IF NOT EXISTS node_buckets (
    bucket     INTEGER NOT NULL,
    node       TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (bucket, node)
) WITHOUT ROWID

-- Schedule declarations: what each node's schedules fire and when, for people (the
-- CLI's `schedules`). A firing never reads them: a schedule belongs to its node.

-- name: schema_schedules
CREATE TABLE IF NOT EXISTS schedules (
    node          TEXT NOT NULL,
    name          TEXT NOT NULL,
    task          TEXT NOT NULL,
    trigger_text  TEXT NOT NULL,
    next_fire_at  TEXT,
    last_fired_at TEXT,
    last_task_id  TEXT,
    fired         INTEGER NOT NULL,
    skipped       INTEGER NOT NULL,
    updated_at    TEXT NOT NULL,
    PRIMARY KEY (node, name)
) WITHOUT ROWID

-- Pipeline run shapes, for people (the dashboard draws the graph); the graph that drives
-- a run lives in the submitting process.

-- name: schema_pipelines
CREATE TABLE IF NOT EXISTS pipelines (
    pipeline_run_id TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    node            TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    shape           TEXT NOT NULL
)

-- name: schema_idx_pipelines_created_at
CREATE INDEX IF NOT EXISTS idx_pipelines_created_at ON pipelines (created_at)

-- The group commit's statement for a batch of up to 64 rows (a larger batch is written
-- straight into the tables, in a transaction: see _sqlite_group). task_writes is a view
-- nobody reads: inserting a row into it runs one of three triggers, so a whole batch of
-- writes (new tasks, each task's compare-and-set, trail rows) is one INSERT, one
-- statement, atomic on its own (no BEGIN/COMMIT). A compare-and-set that changes no row
-- raises, which undoes the whole statement. Columns: kind, the task's, expect, then the
-- trail's after task_id.

-- Made again at every migration (schemas 13 and 14 added task columns); dropping it drops
-- its triggers, made again below.
-- name: schema_task_writes_drop
DROP VIEW IF EXISTS task_writes

-- name: schema_task_writes
CREATE VIEW IF NOT EXISTS task_writes AS SELECT
    NULL AS kind,
    NULL AS task_id, NULL AS name, NULL AS status, NULL AS status_version,
    NULL AS attempt, NULL AS tags, NULL AS bucket, NULL AS bucket_key,
    NULL AS pipeline_run_id, NULL AS owner, NULL AS created_at, NULL AS started_at,
    NULL AS ended_at, NULL AS last_heartbeat_at, NULL AS progress, NULL AS failure,
    NULL AS outcome, NULL AS lease_owner, NULL AS lease_until, NULL AS run_at,
    NULL AS priority, NULL AS dedupe_key, NULL AS dedupe_window, NULL AS concurrency_key,
    NULL AS trace_context,
    NULL AS expect,
    NULL AS version, NULL AS from_status, NULL AS to_status, NULL AS at, NULL AS reason,
    NULL AS actor
WHERE 0

-- A new task with a dedupe key whose holder is in the store (an unfinished task, or a
-- success within its window of the new task's creation) aborts the statement: the key is
-- checked inside the batch, under the write lock every creator takes, so a deduplicated
-- create rides the group commit like any other (SqlStore finds the holder after).
-- A new task's row carries its first transition (schema 7): one row, so one run of the
-- view's three triggers, where a task and a trail row were two (a create through the
-- view: 192k instructions, 130k). A row without one (version NULL) inserts the task only.
-- It adopts the task's loose trail first (a version found there stays as it was).
-- name: schema_task_writes_new_drop
DROP TRIGGER IF EXISTS task_writes_new

-- name: schema_task_writes_new
CREATE TRIGGER task_writes_new INSTEAD OF INSERT ON task_writes
WHEN NEW.kind = 'new' BEGIN
    SELECT RAISE(ABORT, 'chongming-task: dedupe key held')
    WHERE NEW.dedupe_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM tasks WHERE dedupe_key = NEW.dedupe_key
        AND (status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
             OR (status = 'succeeded' AND dedupe_window IS NOT NULL
                 AND julianday(ended_at) + dedupe_window / 86400.0
                     > julianday(NEW.created_at))));
    INSERT INTO tasks (
        task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
        pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at,
        progress, failure, outcome, lease_owner, lease_until, run_at, priority, dedupe_key,
        dedupe_window, concurrency_key, trace_context
    ) VALUES (
        NEW.task_id, NEW.name, NEW.status, NEW.status_version, NEW.attempt, NEW.tags,
        NEW.bucket, NEW.bucket_key, NEW.pipeline_run_id, NEW.owner, NEW.created_at,
        NEW.started_at, NEW.ended_at, NEW.last_heartbeat_at, NEW.progress, NEW.failure,
        NEW.outcome, NEW.lease_owner, NEW.lease_until, NEW.run_at, NEW.priority,
        NEW.dedupe_key, NEW.dedupe_window, NEW.concurrency_key, NEW.trace_context
    );
    INSERT INTO transitions (key, task_id, version, from_status, to_status, at, reason,
                             actor)
    SELECT (SELECT seq FROM tasks WHERE task_id = NEW.task_id) * 16777216 + version,
           task_id, version, from_status, to_status, at, reason, actor
    FROM loose_transitions WHERE task_id = NEW.task_id
    ON CONFLICT DO NOTHING;
    -- last_insert_rowid() is the task's seq, unless a row was adopted (changes() says):
    -- it is then that row's key, and the seq is looked up.
    INSERT INTO transitions (key, task_id, version, from_status, to_status, at, reason,
                             actor)
    SELECT CASE WHEN changes() = 0 THEN last_insert_rowid()
                ELSE (SELECT seq FROM tasks WHERE task_id = NEW.task_id) END * 16777216
               + NEW.version,
           NEW.task_id, NEW.version, NEW.from_status, NEW.to_status, NEW.at, NEW.reason,
           NEW.actor
    WHERE NEW.version IS NOT NULL
    ON CONFLICT DO NOTHING;
    DELETE FROM loose_transitions WHERE task_id = NEW.task_id;
END

-- Only the columns a task's life changes: the identity columns (name, tags, bucket,
-- bucket_key, pipeline_run_id, owner, created_at) are fixed at create, and leaving them
-- out spares SQLite rewriting four indexes on every write; the lease is touch()'s alone.
-- Schema 6 took owner out: the trigger is made again at every migration. Since schema 8
-- the row carries the write's last transition (the others are trail rows of their own):
-- a row without one (version NULL) writes the task only.
-- name: schema_task_writes_life_drop
DROP TRIGGER IF EXISTS task_writes_life

-- name: schema_task_writes_life
CREATE TRIGGER task_writes_life INSTEAD OF INSERT ON task_writes
WHEN NEW.kind = 'life' BEGIN
    UPDATE tasks SET
        status = NEW.status, status_version = NEW.status_version, attempt = NEW.attempt,
        started_at = NEW.started_at, ended_at = NEW.ended_at,
        last_heartbeat_at = NEW.last_heartbeat_at, progress = NEW.progress,
        failure = NEW.failure, outcome = NEW.outcome
    WHERE task_id = NEW.task_id AND status_version = NEW.expect;
    SELECT RAISE(ABORT, 'chongming-task: status_version moved') WHERE changes() = 0;
    INSERT INTO transitions (key, task_id, version, from_status, to_status, at, reason,
                             actor)
    SELECT seq * 16777216 + NEW.version, NEW.task_id, NEW.version, NEW.from_status,
           NEW.to_status, NEW.at, NEW.reason, NEW.actor
    FROM tasks WHERE task_id = NEW.task_id AND NEW.version IS NOT NULL
    ON CONFLICT DO NOTHING;
END

-- Schema 9 keys the trail by seq: made again at every migration, as the two above.
-- name: schema_task_writes_trail_drop
DROP TRIGGER IF EXISTS task_writes_trail

-- name: schema_task_writes_trail
CREATE TRIGGER task_writes_trail INSTEAD OF INSERT ON task_writes
WHEN NEW.kind = 'trail' BEGIN
    INSERT INTO transitions (key, task_id, version, from_status, to_status, at, reason,
                             actor)
    SELECT seq * 16777216 + NEW.version, NEW.task_id, NEW.version, NEW.from_status,
           NEW.to_status, NEW.at, NEW.reason, NEW.actor
    FROM tasks WHERE task_id = NEW.task_id
    ON CONFLICT DO NOTHING;
    INSERT INTO loose_transitions (task_id, version, from_status, to_status, at, reason,
                                   actor)
    SELECT NEW.task_id, NEW.version, NEW.from_status, NEW.to_status, NEW.at, NEW.reason,
           NEW.actor
    WHERE changes() = 0 AND NOT EXISTS (SELECT 1 FROM tasks WHERE task_id = NEW.task_id)
    ON CONFLICT DO NOTHING;
END
