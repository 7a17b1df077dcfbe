-- The SQLite store's statements, one named block per statement, loaded by name
-- (chongming_task.stores.sql.load_named) and run with bound parameters. The tables they
-- read and write are made by schema.sql.

-- name: insert_task
INSERT INTO tasks (
    task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
    pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at, progress,
    failure, outcome, lease_owner, lease_until, run_at, priority, dedupe_key, dedupe_window,
    concurrency_key, trace_context
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- save writes every column but the lease (docs/design.md, "Leases are not heartbeats").
-- name: save_task
UPDATE tasks SET
    name = ?, status = ?, status_version = ?, attempt = ?, tags = ?, bucket = ?,
    bucket_key = ?, pipeline_run_id = ?, owner = ?, created_at = ?, started_at = ?,
    ended_at = ?, last_heartbeat_at = ?, progress = ?, failure = ?, outcome = ?, run_at = ?,
    priority = ?, dedupe_key = ?, dedupe_window = ?, concurrency_key = ?,
    trace_context = ?
WHERE task_id = ? AND status_version = ?

-- name: stored_version
SELECT status_version FROM tasks WHERE task_id = ?

-- name: get_task
SELECT task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
    pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at, progress,
    failure, outcome, lease_owner, lease_until, run_at, priority, dedupe_key, dedupe_window,
    concurrency_key, trace_context
FROM tasks WHERE task_id = ?

-- get_task's columns, the result only where it has no preview (its JSON text is 4000
-- characters or fewer: roles.PREVIEW), then the preview. The result is the row's last
-- column, so nothing here walks a long one's overflow pages.
-- name: get_previewed
SELECT task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
    pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at, progress,
    failure, CASE WHEN outcome_preview IS NULL THEN outcome END, lease_owner, lease_until,
    run_at, priority, dedupe_key, dedupe_window, concurrency_key, trace_context,
    outcome_preview
FROM tasks WHERE task_id = ?

-- name: result_json
SELECT outcome FROM tasks WHERE task_id = ?

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

-- Each node with its buckets, in one statement: the buckets as text, '1,2,3', NULL for
-- none.
-- name: nodes
SELECT n.node, n.num_buckets, n.all_buckets, n.ttl_seconds, n.started_at, n.seen_at,
       n.stopped_at, n.host, n.pid, n.health, group_concat(b.bucket, ',')
FROM nodes n LEFT JOIN node_buckets b ON b.node = n.node
GROUP BY n.node

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

-- name: prune_hold
DELETE FROM holds WHERE task_id = ?

-- name: hold_task
INSERT OR REPLACE INTO holds (task_id, since, held_by) VALUES (?, ?, ?)

-- name: release_hold
DELETE FROM holds WHERE task_id = ?

-- name: holds
SELECT task_id, since FROM holds ORDER BY since LIMIT ?

-- name: holds_of
SELECT task_id, since FROM holds WHERE task_id IN (SELECT value FROM json_each(?))

-- A pipeline run goes with its last task: ?1 the run of a task just pruned.
-- name: prune_pipeline
DELETE FROM pipelines WHERE pipeline_run_id = ?1
  AND NOT EXISTS (SELECT 1 FROM tasks WHERE pipeline_run_id = ?1)

-- Every pipeline run with no task left (``prune`` by count, which reads them all anyway).
-- name: prune_orphan_pipelines
DELETE FROM pipelines WHERE NOT EXISTS (
    SELECT 1 FROM tasks WHERE tasks.pipeline_run_id = pipelines.pipeline_run_id
)

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

-- The tasks that may hold a dedupe key (create_deduped): the unfinished one, and successes
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
