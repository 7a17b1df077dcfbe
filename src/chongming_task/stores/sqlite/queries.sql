-- The SQLite store's schema and statements, one named block per statement, loaded by
-- name (chongming_task.stores._sql.load_named). Blocks named schema_* are the schema, run
-- in file order inside one BEGIN IMMEDIATE by the migration; every other block is a
-- statement the store runs with bound parameters. Column lists follow
-- chongming_task.stores.codec (a test compares them with the tables made here).

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
    outcome           TEXT,
    lease_owner       TEXT,
    lease_until       TEXT,
    run_at            TEXT,
    priority          INTEGER NOT NULL DEFAULT 0,
    dedupe_key        TEXT,
    dedupe_window     REAL,
    concurrency_key   TEXT
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

-- Made again at every migration (schema 13 added the option columns); dropping it drops
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
    NULL AS expect,
    NULL AS version, NULL AS from_status, NULL AS to_status, NULL AS at, NULL AS reason,
    NULL AS actor
WHERE 0

-- A new task with a dedupe key whose holder is in the store (an unfinished task, or a
-- success within its window of the new task's creation) aborts the statement: the key is
-- checked inside the batch, under the write lock every creator takes, so a deduplicated
-- create rides the group commit like any other (DedupeSQL finds the holder after).
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
        dedupe_window, concurrency_key
    ) VALUES (
        NEW.task_id, NEW.name, NEW.status, NEW.status_version, NEW.attempt, NEW.tags,
        NEW.bucket, NEW.bucket_key, NEW.pipeline_run_id, NEW.owner, NEW.created_at,
        NEW.started_at, NEW.ended_at, NEW.last_heartbeat_at, NEW.progress, NEW.failure,
        NEW.outcome, NEW.lease_owner, NEW.lease_until, NEW.run_at, NEW.priority,
        NEW.dedupe_key, NEW.dedupe_window, NEW.concurrency_key
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

-- name: insert_task
INSERT INTO tasks (
    task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
    pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at, progress,
    failure, outcome, lease_owner, lease_until, run_at, priority, dedupe_key, dedupe_window,
    concurrency_key
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- save writes every column but the lease (docs/design.md, "Leases are not heartbeats").
-- name: save_task
UPDATE tasks SET
    name = ?, status = ?, status_version = ?, attempt = ?, tags = ?, bucket = ?,
    bucket_key = ?, pipeline_run_id = ?, owner = ?, created_at = ?, started_at = ?,
    ended_at = ?, last_heartbeat_at = ?, progress = ?, failure = ?, outcome = ?, run_at = ?,
    priority = ?, dedupe_key = ?, dedupe_window = ?, concurrency_key = ?
WHERE task_id = ? AND status_version = ?

-- name: stored_version
SELECT status_version FROM tasks WHERE task_id = ?

-- name: get_task
SELECT task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
    pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at, progress,
    failure, outcome, lease_owner, lease_until, run_at, priority, dedupe_key, dedupe_window,
    concurrency_key
FROM tasks WHERE task_id = ?

-- name: counts
SELECT status, COUNT(*) FROM tasks GROUP BY status

-- Tasks per bucket, the bucketless under NULL (when there are some), in one statement:
-- the partial bucket index answers the first part; the second counts all tasks on the
-- smallest index and takes the others away, where bucket IS NULL would read the table.
-- name: bucket_totals
SELECT bucket, COUNT(*) FROM tasks WHERE bucket IS NOT NULL GROUP BY bucket
UNION ALL
SELECT NULL, (SELECT COUNT(*) FROM tasks) - (SELECT COUNT(*) FROM tasks WHERE bucket IS NOT NULL)

-- Not on a finished row (the terminal statuses, as below).
-- name: touch_task
UPDATE tasks SET
    progress = COALESCE(?, progress),
    last_heartbeat_at = COALESCE(?, last_heartbeat_at),
    lease_owner = COALESCE(?, lease_owner),
    lease_until = COALESCE(?, lease_until)
WHERE task_id = ?
    AND status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')

-- The terminal statuses (chongming_task.states.TERMINAL; a test keeps them equal):
-- progress, heartbeats and leases never land on a finished row, nor on one another node
-- holds. RETURNING: what was refused is what is missing.
-- name: renew_lease
UPDATE tasks SET lease_owner = ?, lease_until = ?
WHERE task_id = ? AND status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
    AND (lease_owner IS NULL OR lease_owner = ?)
RETURNING task_id

-- name: write_activity
UPDATE tasks SET
    progress = COALESCE(?, progress),
    last_heartbeat_at = COALESCE(?, last_heartbeat_at)
WHERE task_id = ? AND status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
    AND (lease_owner IS NULL OR lease_owner = ?)
RETURNING task_id

-- A task's trail rows are found by (seq, task_id); a task not in tasks has its rows in
-- loose_transitions. append writes a row of a task the store holds (no row changed: the
-- task is not held, or the version is there already); append_loose a row of one it does
-- not hold.
-- name: append
INSERT INTO transitions (key, task_id, version, from_status, to_status, at, reason, actor)
SELECT seq * 16777216 + ?2, ?1, ?2, ?3, ?4, ?5, ?6, ?7 FROM tasks WHERE task_id = ?1
ON CONFLICT DO NOTHING

-- name: append_loose
INSERT INTO loose_transitions (task_id, version, from_status, to_status, at, reason, actor)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 WHERE NOT EXISTS (SELECT 1 FROM tasks WHERE task_id = ?1)
ON CONFLICT DO NOTHING

-- Every loose row whose task is now held moves to transitions (after a create outside
-- the write view; nearly always there is none). Driven by the loose rows, a lookup in
-- tasks each (CROSS JOIN keeps that order): the other way round reads every task.
-- name: adopt_loose
INSERT INTO transitions (key, task_id, version, from_status, to_status, at, reason, actor)
SELECT t.seq * 16777216 + l.version, l.task_id, l.version, l.from_status, l.to_status, l.at,
       l.reason, l.actor
FROM loose_transitions l CROSS JOIN tasks t WHERE t.task_id = l.task_id
ON CONFLICT DO NOTHING

-- name: adopt_loose_done
DELETE FROM loose_transitions
WHERE EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = loose_transitions.task_id)

-- name: history
SELECT tr.task_id, tr.version, tr.from_status, tr.to_status, tr.at, tr.reason, tr.actor
FROM tasks t JOIN transitions tr
    ON tr.key BETWEEN t.seq * 16777216 AND t.seq * 16777216 + 16777215
WHERE t.task_id = ?1 AND tr.task_id = ?1 AND tr.version > ?2
UNION ALL
SELECT task_id, version, from_status, to_status, at, reason, actor
FROM loose_transitions
WHERE task_id = ?1 AND version > ?2
ORDER BY version

-- name: mark_lost
UPDATE tasks SET status = ?, status_version = ?, ended_at = ?, failure = ?
WHERE task_id = ? AND status_version = ?

-- name: insert_command
INSERT INTO commands (
    command_id, task_id, action, issued_by, created_at, reason, lease_until, finished_at,
    outcome
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)

-- Every open command in arrival order (rowid: assigned at insert, above every row kept),
-- with whether a claim's lease still holds it; the claim picks from them.
-- name: open_commands
SELECT lease_until IS NOT NULL AND lease_until > ? AS leased, command_id, task_id, action,
    issued_by, created_at, reason, lease_until, finished_at, outcome
FROM commands WHERE finished_at IS NULL
ORDER BY rowid LIMIT ?

-- The open commands one node may act on (see Postgres's). The terminal statuses
-- (chongming_task.states.TERMINAL; a test keeps them equal).
-- name: open_commands_for
SELECT c.lease_until IS NOT NULL AND c.lease_until > ? AS leased, c.command_id, c.task_id,
    c.action, c.issued_by, c.created_at, c.reason, c.lease_until, c.finished_at, c.outcome
FROM commands c LEFT JOIN tasks t ON t.task_id = c.task_id
WHERE c.finished_at IS NULL
    AND (t.task_id IS NULL OR t.lease_owner IS NULL OR t.lease_owner = ?
         OR t.status IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost'))
ORDER BY c.rowid LIMIT ?

-- name: pending_commands
SELECT command_id, task_id, action, issued_by, created_at, reason, lease_until,
    finished_at, outcome
FROM commands WHERE task_id = ? AND finished_at IS NULL
ORDER BY rowid

-- name: lease_command
UPDATE commands SET lease_until = ? WHERE command_id = ?

-- name: complete_command
UPDATE commands SET finished_at = ?, outcome = ?, lease_until = NULL WHERE command_id = ?

-- name: release_command
UPDATE commands SET lease_until = NULL WHERE command_id = ? AND finished_at IS NULL

-- The terminal statuses (chongming_task.states.TERMINAL; a test keeps them equal).
-- name: prunable
SELECT task_id, seq FROM tasks
WHERE status IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
ORDER BY created_at DESC, seq DESC LIMIT -1 OFFSET ?

-- ?1 a task's id, ?2 its seq (from prunable): its trail is the keys of that seq
-- name: prune_history
DELETE FROM transitions
WHERE key BETWEEN ?2 * 16777216 AND ?2 * 16777216 + 16777215 AND task_id = ?1

-- name: prune_commands
DELETE FROM commands WHERE task_id = ? AND finished_at IS NOT NULL

-- name: prune_task
DELETE FROM tasks WHERE task_id = ?

-- name: upsert_node
INSERT INTO nodes (node, num_buckets, all_buckets, ttl_seconds, started_at, seen_at,
                   stopped_at, host, pid, health)
VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)
ON CONFLICT (node) DO UPDATE SET
    num_buckets = excluded.num_buckets, all_buckets = excluded.all_buckets,
    ttl_seconds = excluded.ttl_seconds, started_at = excluded.started_at,
    seen_at = excluded.seen_at, stopped_at = NULL, host = excluded.host, pid = excluded.pid,
    health = excluded.health

-- name: forget_node_buckets
DELETE FROM node_buckets WHERE node = ?

-- name: declare_node_bucket
INSERT INTO node_buckets (bucket, node, updated_at) VALUES (?, ?, ?)

-- name: refresh_node
UPDATE nodes SET seen_at = ?, health = COALESCE(?, health) WHERE node = ? AND stopped_at IS NULL

-- The beacon, and the open commands no claim holds that this node may claim, in one
-- statement (see Postgres's).
-- name: pulse_node
UPDATE nodes SET seen_at = ?, health = COALESCE(?, health)
WHERE node = ? AND stopped_at IS NULL
RETURNING (SELECT count(*) FROM commands c LEFT JOIN tasks t ON t.task_id = c.task_id
           WHERE c.finished_at IS NULL
           AND (c.lease_until IS NULL OR c.lease_until <= nodes.seen_at)
           AND (t.task_id IS NULL OR t.lease_owner IS NULL OR t.lease_owner = nodes.node
                OR t.status IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')))

-- name: retire_node
UPDATE nodes SET stopped_at = ? WHERE node = ?

-- name: nodes
SELECT node, num_buckets, all_buckets, ttl_seconds, started_at, seen_at, stopped_at, host,
       pid, health
FROM nodes

-- name: record_late_report
INSERT INTO late_reports (task_id, reported_by, reported_at, status, ended_at, outcome,
                          failure, stored_status)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (task_id) DO UPDATE SET
    reported_by = excluded.reported_by, reported_at = excluded.reported_at,
    status = excluded.status, ended_at = excluded.ended_at, outcome = excluded.outcome,
    failure = excluded.failure, stored_status = excluded.stored_status

-- name: late_reports_of
SELECT task_id, reported_by, reported_at, status, ended_at, outcome, failure, stored_status
FROM late_reports WHERE task_id IN (SELECT value FROM json_each(?))
ORDER BY reported_at DESC

-- name: late_reports
SELECT task_id, reported_by, reported_at, status, ended_at, outcome, failure, stored_status
FROM late_reports ORDER BY reported_at DESC LIMIT ?

-- name: count_late_reports
SELECT COUNT(*) FROM late_reports

-- name: prune_late_report
DELETE FROM late_reports WHERE task_id = ?

-- name: node_buckets
SELECT node, bucket FROM node_buckets ORDER BY node, bucket

-- reconcile() in one transaction (BEGIN IMMEDIATE: no other writer in between): the
-- expired tasks (the {scan} condition, built from a TaskScan) but the caller's own
-- (a JSON array), each with the verdict of its lease owner ('' for none), marked lost
-- with a trail row. Temporary tables hold the verdicts and the doomed tasks.
-- name: expired_owners
SELECT DISTINCT lease_owner FROM tasks WHERE {scan}

-- name: lost_verdicts_table
CREATE TEMP TABLE IF NOT EXISTS lost_verdicts (
    owner TEXT PRIMARY KEY, failure TEXT, reason TEXT
)

-- name: lost_doomed_table
CREATE TEMP TABLE IF NOT EXISTS lost_doomed (
    task_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, from_status TEXT NOT NULL,
    version INTEGER NOT NULL, owner TEXT NOT NULL
)

-- name: lost_clear_verdicts
DELETE FROM lost_verdicts

-- name: lost_clear_doomed
DELETE FROM lost_doomed

-- name: lost_verdict
INSERT INTO lost_verdicts (owner, failure, reason) VALUES (?, ?, ?)

-- name: lost_doom
INSERT INTO lost_doomed (task_id, seq, from_status, version, owner)
SELECT task_id, seq, status, status_version + 1, COALESCE(lease_owner, '') FROM tasks
WHERE {scan} AND task_id NOT IN (SELECT value FROM json_each(?))

-- name: lost_mark
UPDATE tasks SET status = 'lost', status_version = m.version, ended_at = ?,
    failure = m.failure
FROM (
    SELECT d.task_id, d.version, v.failure
    FROM lost_doomed d JOIN lost_verdicts v ON v.owner = d.owner
) AS m
WHERE tasks.task_id = m.task_id

-- name: lost_trail
INSERT INTO transitions (key, task_id, version, from_status, to_status, at, reason, actor)
SELECT d.seq * 16777216 + d.version, d.task_id, d.version, d.from_status, 'lost', ?,
       v.reason, ?
FROM lost_doomed d JOIN lost_verdicts v ON v.owner = d.owner
WHERE 1
ON CONFLICT DO NOTHING

-- name: lost_marked
SELECT task_id FROM lost_doomed

-- name: upsert_schedule
INSERT INTO schedules (node, name, task, trigger_text, next_fire_at, last_fired_at,
                       last_task_id, fired, skipped, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (node, name) DO UPDATE SET
    task = excluded.task, trigger_text = excluded.trigger_text,
    next_fire_at = excluded.next_fire_at, last_fired_at = excluded.last_fired_at,
    last_task_id = excluded.last_task_id, fired = excluded.fired,
    skipped = excluded.skipped, updated_at = excluded.updated_at

-- name: forget_schedule
DELETE FROM schedules WHERE node = ? AND name = ?

-- name: schedules
SELECT node, name, task, trigger_text, next_fire_at, last_fired_at, last_task_id, fired,
       skipped, updated_at
FROM schedules ORDER BY node, name

-- name: upsert_pipeline
INSERT OR REPLACE INTO pipelines (pipeline_run_id, name, node, created_at, shape)
VALUES (?, ?, ?, ?, ?)

-- name: pipeline
SELECT pipeline_run_id, name, node, created_at, shape FROM pipelines WHERE pipeline_run_id = ?

-- name: pipelines
SELECT pipeline_run_id, name, node, created_at, shape FROM pipelines
ORDER BY created_at DESC LIMIT ?

-- name: finished_commands
SELECT command_id, task_id, action, issued_by, created_at, reason, lease_until,
    finished_at, outcome
FROM commands WHERE finished_at > ?
ORDER BY finished_at LIMIT ?

-- The tasks that may hold a dedupe key (DedupeSQL): the unfinished one, and successes
-- that keep it for a window; one probe of idx_tasks_dedupe.
-- name: dedupe_holders
SELECT task_id, status, ended_at, dedupe_window FROM tasks
WHERE dedupe_key = ?
  AND (status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
       OR (status = 'succeeded' AND dedupe_window IS NOT NULL))

-- A new task's dedupe key held, for a batch written straight into the tables (more rows
-- than one statement takes), as the write view's trigger checks it.
-- name: dedupe_held
SELECT 1 FROM tasks WHERE dedupe_key = ?
  AND (status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
       OR (status = 'succeeded' AND dedupe_window IS NOT NULL
           AND julianday(ended_at) + dedupe_window / 86400.0 > julianday(?)))

-- Finished commands by age, oldest first, through the index of finished commands (see
-- Postgres's).
-- name: prune_finished_commands
DELETE FROM commands WHERE rowid IN (
    SELECT rowid FROM commands
    WHERE finished_at IS NOT NULL AND finished_at < ?
    ORDER BY finished_at LIMIT ?
)

-- name: count_finished_commands
SELECT COUNT(*) FROM commands WHERE finished_at IS NOT NULL AND finished_at < ?
