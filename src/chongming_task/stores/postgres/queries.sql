-- The PostgreSQL store's statements, one named block per statement, loaded by name
-- (chongming_task.stores.sql.load_named). The schema is stores/postgres/schema.sql. Column
-- lists follow chongming_task.stores.codec; JSONB columns are read as text (the codec
-- decodes JSON text) and written with ::jsonb, times with ::timestamptz.

-- A new task whose dedupe key an unfinished task holds fails on idx_tasks_dedupe_open; one
-- whose key a success keeps (its window from the new task's creation) is not inserted,
-- as an existing id is not (SqlStore then finds the holder).
-- name: insert_task
INSERT INTO {schema}.tasks (
    task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
    pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at, progress,
    failure, outcome, lease_owner, lease_until, run_at, priority, dedupe_key, dedupe_window,
    concurrency_key, trace_context
)
SELECT * FROM (VALUES (
    %s::text, %s::text, %s::text, %s::int, %s::int, %s::jsonb, %s::int, %s::text, %s::text,
    %s::text, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::jsonb,
    %s::jsonb, %s::jsonb, %s::text, %s::timestamptz, %s::timestamptz, %s::int, %s::text,
    %s::float8, %s::text, %s::text
)) AS v (
    task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
    pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at, progress,
    failure, outcome, lease_owner, lease_until, run_at, priority, dedupe_key, dedupe_window,
    concurrency_key, trace_context
)
WHERE v.dedupe_key IS NULL OR NOT EXISTS (
    SELECT FROM {schema}.tasks t WHERE t.dedupe_key = v.dedupe_key AND t.status = 'succeeded'
      AND t.dedupe_window IS NOT NULL
      AND t.ended_at + t.dedupe_window * interval '1 second' > v.created_at
)
ON CONFLICT (task_id) DO NOTHING

-- save writes every column but the lease (docs/design.md, "Leases are not heartbeats").
-- name: save_task
UPDATE {schema}.tasks SET
    name = %s, status = %s, status_version = %s, attempt = %s, tags = %s::jsonb,
    bucket = %s, bucket_key = %s, pipeline_run_id = %s, owner = %s,
    created_at = %s::timestamptz, started_at = %s::timestamptz, ended_at = %s::timestamptz,
    last_heartbeat_at = %s::timestamptz, progress = %s::jsonb, failure = %s::jsonb,
    outcome = %s::jsonb, run_at = %s::timestamptz, priority = %s, dedupe_key = %s,
    dedupe_window = %s, concurrency_key = %s, trace_context = %s
WHERE task_id = %s AND status_version = %s

-- name: schema_version
SELECT version FROM {schema}.schema_version

-- name: tasks_table
SELECT to_regclass('{schema}.tasks')

-- name: stored_version
SELECT status_version FROM {schema}.tasks WHERE task_id = %s

-- name: get_task
SELECT task_id, name, status, status_version, attempt, tags::text, bucket, bucket_key,
    pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at,
    progress::text, failure::text, outcome::text, lease_owner, lease_until, run_at, priority,
    dedupe_key, dedupe_window, concurrency_key, trace_context
FROM {schema}.tasks WHERE task_id = %s

-- get_task's columns, the result only where its preview holds it whole (4000 characters
-- or fewer: roles.PREVIEW), then the preview where it does not. TOAST keeps a long
-- result out of the row: it is not read.
-- name: get_previewed
SELECT task_id, name, status, status_version, attempt, tags::text, bucket, bucket_key,
    pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at,
    progress::text, failure::text,
    CASE WHEN length(outcome_preview) <= 4000 THEN outcome::text END,
    lease_owner, lease_until, run_at, priority, dedupe_key, dedupe_window, concurrency_key,
    trace_context, CASE WHEN length(outcome_preview) > 4000 THEN outcome_preview END
FROM {schema}.tasks WHERE task_id = %s

-- name: result_json
SELECT outcome::text FROM {schema}.tasks WHERE task_id = %s

-- name: counts
SELECT status, COUNT(*) FROM {schema}.tasks GROUP BY status

-- Not on a finished row (the terminal statuses, as below).
-- name: touch_task
UPDATE {schema}.tasks SET
    progress = COALESCE(%s::jsonb, progress),
    last_heartbeat_at = COALESCE(%s::timestamptz, last_heartbeat_at),
    lease_owner = COALESCE(%s, lease_owner),
    lease_until = COALESCE(%s::timestamptz, lease_until)
WHERE task_id = %s
    AND status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')

-- The terminal statuses (chongming_task.states.TERMINAL; a test keeps them equal):
-- progress, heartbeats and leases never land on a finished row, nor on one another node
-- holds. RETURNING: what was refused is what is missing.
-- name: renew_lease
UPDATE {schema}.tasks SET lease_owner = %s, lease_until = %s::timestamptz
WHERE task_id = %s AND status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
    AND (lease_owner IS NULL OR lease_owner = %s)
RETURNING task_id

-- name: write_activity
UPDATE {schema}.tasks SET
    progress = COALESCE(%s::jsonb, progress),
    last_heartbeat_at = COALESCE(%s::timestamptz, last_heartbeat_at)
WHERE task_id = %s AND status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
    AND (lease_owner IS NULL OR lease_owner = %s)
RETURNING task_id

-- name: append
INSERT INTO {schema}.transitions (task_id, version, from_status, to_status, at, reason, actor)
VALUES (%s, %s, %s, %s, %s::timestamptz, %s, %s)
ON CONFLICT (task_id, version) DO NOTHING

-- name: history
SELECT task_id, version, from_status, to_status, at, reason, actor
FROM {schema}.transitions WHERE task_id = %s AND version > %s ORDER BY version

-- name: insert_command
INSERT INTO {schema}.commands (
    command_id, task_id, action, issued_by, created_at, reason, lease_until, finished_at,
    outcome
) VALUES (%s, %s, %s, %s, %s::timestamptz, %s, %s::timestamptz, %s::timestamptz, %s)

-- Every open command in arrival order (seq: assigned at insert), with whether a claim's
-- lease still holds it; the claim picks from them, then locks what it picked.
-- name: open_commands
SELECT lease_until IS NOT NULL AND lease_until > %s::timestamptz AS leased, command_id,
    task_id, action, issued_by, created_at, reason, lease_until, finished_at, outcome
FROM {schema}.commands WHERE finished_at IS NULL
ORDER BY seq LIMIT %s

-- The open commands one node may act on: those of tasks it holds (lease_owner), and
-- those of tasks nobody holds (gone, finished, or never leased), which anyone completes
-- as such. A task's commands are all in or all out, so their order holds. The terminal
-- statuses (chongming_task.states.TERMINAL; a test keeps them equal).
-- name: open_commands_for
SELECT c.lease_until IS NOT NULL AND c.lease_until > %s::timestamptz AS leased,
    c.command_id, c.task_id, c.action, c.issued_by, c.created_at, c.reason, c.lease_until,
    c.finished_at, c.outcome
FROM {schema}.commands c LEFT JOIN {schema}.tasks t ON t.task_id = c.task_id
WHERE c.finished_at IS NULL
    AND (t.task_id IS NULL OR t.lease_owner IS NULL OR t.lease_owner = %s
         OR t.status IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost'))
ORDER BY c.seq LIMIT %s

-- SKIP LOCKED: a command another claimer is taking right now is not waited for; the
-- claim leaves it, and every later command of its task, to the next claim.
-- name: lock_commands
SELECT command_id FROM {schema}.commands
WHERE command_id = ANY(%s) AND finished_at IS NULL
    AND (lease_until IS NULL OR lease_until <= %s::timestamptz)
FOR UPDATE SKIP LOCKED

-- name: lease_command
UPDATE {schema}.commands SET lease_until = %s::timestamptz WHERE command_id = %s

-- name: pending_commands
SELECT command_id, task_id, action, issued_by, created_at, reason, lease_until,
    finished_at, outcome
FROM {schema}.commands WHERE task_id = %s AND finished_at IS NULL
ORDER BY seq

-- name: complete_command
UPDATE {schema}.commands SET finished_at = %s::timestamptz, outcome = %s, lease_until = NULL
WHERE command_id = %s

-- name: release_command
UPDATE {schema}.commands SET lease_until = NULL WHERE command_id = %s AND finished_at IS NULL

-- The terminal statuses (chongming_task.states.TERMINAL; a test keeps them equal).
-- name: prune
WITH doomed AS (
    SELECT task_id FROM {schema}.tasks
    WHERE status IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
    ORDER BY created_at DESC, seq DESC OFFSET %s
),
gone_history AS (DELETE FROM {schema}.transitions WHERE task_id IN (SELECT task_id FROM doomed)),
gone_reports AS (DELETE FROM {schema}.late_reports WHERE task_id IN (SELECT task_id FROM doomed)),
gone_holds AS (DELETE FROM {schema}.holds WHERE task_id IN (SELECT task_id FROM doomed)),
gone_commands AS (
    DELETE FROM {schema}.commands WHERE finished_at IS NOT NULL
    AND task_id IN (SELECT task_id FROM doomed)
)
DELETE FROM {schema}.tasks WHERE task_id IN (SELECT task_id FROM doomed)

-- Node declarations (docs/design.md, "Fleet declarations"); times come from storage_now().
-- name: upsert_node
INSERT INTO {schema}.nodes (node, num_buckets, all_buckets, ttl_seconds, started_at, seen_at,
                   stopped_at, host, pid, health)
VALUES (%s, %s, %s, %s, COALESCE(%s::timestamptz, statement_timestamp()),
        COALESCE(%s::timestamptz, statement_timestamp()), NULL, %s, %s, %s)
ON CONFLICT (node) DO UPDATE SET
    num_buckets = excluded.num_buckets, all_buckets = excluded.all_buckets,
    ttl_seconds = excluded.ttl_seconds, started_at = excluded.started_at,
    seen_at = excluded.seen_at, stopped_at = NULL, host = excluded.host, pid = excluded.pid,
    health = excluded.health

-- name: forget_node_buckets
DELETE FROM {schema}.node_buckets WHERE node = %s

-- name: declare_node_bucket
INSERT INTO {schema}.node_buckets (bucket, node, updated_at)
VALUES (%s, %s, COALESCE(%s::timestamptz, statement_timestamp()))

-- Node times: the server's clock where the store passes none (it always does: one
-- clock for every node's liveness, read here rather than in a round trip of its own).
-- name: refresh_node
UPDATE {schema}.nodes SET seen_at = COALESCE(%s::timestamptz, statement_timestamp()),
                 health = COALESCE(%s, health)
WHERE node = %s AND stopped_at IS NULL

-- The beacon, and the open commands no claim holds that this node may claim (as in
-- open_commands_for: its tasks' and nobody's), in one statement: an idle node's poller
-- needs no statement of its own, and another node's commands never wake it (the partial
-- index of open commands answers, each one's task by its key).
-- name: pulse_node
UPDATE {schema}.nodes SET seen_at = COALESCE(%s::timestamptz, statement_timestamp()),
                 health = COALESCE(%s, health)
WHERE node = %s AND stopped_at IS NULL
RETURNING (SELECT count(*) FROM {schema}.commands c LEFT JOIN {schema}.tasks t ON t.task_id = c.task_id
           WHERE c.finished_at IS NULL
           AND (c.lease_until IS NULL OR c.lease_until <= nodes.seen_at)
           AND (t.task_id IS NULL OR t.lease_owner IS NULL OR t.lease_owner = nodes.node
                OR t.status IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')))

-- name: retire_node
UPDATE {schema}.nodes SET stopped_at = COALESCE(%s::timestamptz, statement_timestamp()) WHERE node = %s

-- Each node with its buckets, in one statement (one transaction of an idle node's
-- reconcile, not two: its statements, counted, 0.233 a second before and 0.200 after):
-- the buckets as text, '1,2,3', NULL for none.
-- name: nodes
SELECT n.node, n.num_buckets, n.all_buckets, n.ttl_seconds, n.started_at, n.seen_at,
       n.stopped_at, n.host, n.pid, n.health, string_agg(b.bucket::text, ',')
FROM {schema}.nodes n LEFT JOIN {schema}.node_buckets b ON b.node = n.node
GROUP BY n.node

-- name: hold_task
INSERT INTO {schema}.holds (task_id, since, held_by) VALUES (%s, %s::timestamptz, %s)
ON CONFLICT (task_id) DO UPDATE SET since = excluded.since, held_by = excluded.held_by

-- name: release_hold
DELETE FROM {schema}.holds WHERE task_id = %s

-- name: holds
SELECT task_id, since FROM {schema}.holds ORDER BY since LIMIT %s

-- name: holds_of
SELECT task_id, since FROM {schema}.holds WHERE task_id = ANY(%s::text[])

-- name: record_late_report
INSERT INTO {schema}.late_reports (task_id, reported_by, reported_at, status, ended_at, outcome,
                          failure, stored_status)
VALUES (%s, %s, %s::timestamptz, %s, %s::timestamptz, %s::jsonb, %s::jsonb, %s)
ON CONFLICT (task_id) DO UPDATE SET
    reported_by = excluded.reported_by, reported_at = excluded.reported_at,
    status = excluded.status, ended_at = excluded.ended_at, outcome = excluded.outcome,
    failure = excluded.failure, stored_status = excluded.stored_status

-- name: late_reports_of
SELECT task_id, reported_by, reported_at, status, ended_at, outcome::text, failure::text,
       stored_status
FROM {schema}.late_reports WHERE task_id = ANY(%s::text[])
ORDER BY reported_at DESC

-- name: late_reports
SELECT task_id, reported_by, reported_at, status, ended_at, outcome::text, failure::text,
       stored_status
FROM {schema}.late_reports ORDER BY reported_at DESC LIMIT %s

-- name: count_late_reports
SELECT COUNT(*) FROM {schema}.late_reports

-- name: storage_now
SELECT statement_timestamp()

-- reconcile(): every task its own compare-and-set, all in one statement. The arrays
-- (bound in binary: %b, no text escaping per element) are one row per task: id, new version, ended_at, failure, then the trail row's from
-- status, time, reason and actor. The trail row is written only where the update won.
-- name: mark_lost
WITH marks AS (
    SELECT * FROM unnest(
        %b::text[], %b::int[], %b::timestamptz[], %b::jsonb[], %b::text[],
        %b::timestamptz[], %b::text[], %b::text[]
    ) AS m(task_id, version, ended_at, failure, from_status, at, reason, actor)
), won AS (
    UPDATE {schema}.tasks t
    SET status = 'lost', status_version = m.version, ended_at = m.ended_at,
        failure = m.failure
    FROM marks m
    WHERE t.task_id = m.task_id AND t.status_version = m.version - 1
    RETURNING t.task_id
), trail AS (
    INSERT INTO {schema}.transitions (task_id, version, from_status, to_status, at, reason, actor)
    SELECT m.task_id, m.version, m.from_status, 'lost', m.at, m.reason, m.actor
    FROM marks m JOIN won USING (task_id)
    ON CONFLICT (task_id, version) DO NOTHING
)
SELECT task_id FROM won

-- submit: many tasks and their creation rows in one statement, one array per column.
-- An existing id makes the statement insert fewer rows than it was given (checked by
-- the store, which then rolls the transaction back).
-- name: create_many
WITH new AS (
    INSERT INTO {schema}.tasks (
        task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
        pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at,
        progress, failure, outcome, lease_owner, lease_until, run_at, priority, dedupe_key,
        dedupe_window, concurrency_key, trace_context
    )
    SELECT * FROM unnest(
        %b::text[], %b::text[], %b::text[], %b::int[], %b::int[], %b::jsonb[], %b::int[],
        %b::text[], %b::text[], %b::text[], %b::timestamptz[], %b::timestamptz[],
        %b::timestamptz[], %b::timestamptz[], %b::jsonb[], %b::jsonb[], %b::jsonb[],
        %b::text[], %b::timestamptz[], %b::timestamptz[], %b::int[], %b::text[],
        %b::float8[], %b::text[], %b::text[]
    )
    ON CONFLICT (task_id) DO NOTHING
    RETURNING task_id
), trail AS (
    INSERT INTO {schema}.transitions (task_id, version, from_status, to_status, at, reason, actor)
    SELECT t.* FROM unnest(
        %b::text[], %b::int[], %b::text[], %b::text[], %b::timestamptz[], %b::text[],
        %b::text[]
    ) AS t(task_id, version, from_status, to_status, at, reason, actor)
    JOIN new USING (task_id)
    ON CONFLICT (task_id, version) DO NOTHING
)
SELECT COUNT(*) FROM new

-- reconcile() in one statement: the expired tasks (the {scan} condition, built from a
-- TaskScan) but the caller's own, each locked and compare-and-set to lost, each with the
-- verdict of its lease owner (arrays: owner, failure, reason; '' for no owner), and a
-- trail row where it won. SKIP LOCKED: a task its holder is writing is left alone.
-- name: mark_expired_lost
WITH verdicts AS (
    SELECT * FROM unnest(%b::text[], %b::jsonb[], %b::text[]) AS v(owner, failure, reason)
), doomed AS (
    SELECT tasks.task_id, tasks.status AS from_status, tasks.status_version,
           v.failure, v.reason
    FROM {schema}.tasks JOIN verdicts v ON v.owner = COALESCE(tasks.lease_owner, '')
    WHERE {scan} AND NOT (tasks.task_id = ANY(%b::text[]))
    FOR UPDATE OF tasks SKIP LOCKED
), won AS (
    UPDATE {schema}.tasks t
    SET status = 'lost', status_version = d.status_version + 1,
        ended_at = %b::timestamptz, failure = d.failure
    FROM doomed d
    WHERE t.task_id = d.task_id AND t.status_version = d.status_version
    RETURNING t.task_id, t.status_version, d.from_status, d.reason
), trail AS (
    INSERT INTO {schema}.transitions (task_id, version, from_status, to_status, at, reason, actor)
    SELECT task_id, status_version, from_status, 'lost', %b::timestamptz, reason, %b
    FROM won
    ON CONFLICT (task_id, version) DO NOTHING
)
SELECT task_id FROM won

-- The lease owners of the tasks reconcile would mark (the same {scan} condition).
-- name: expired_owners
SELECT DISTINCT lease_owner FROM {schema}.tasks WHERE {scan}

-- name: upsert_schedule
INSERT INTO {schema}.schedules (node, name, task, trigger_text, next_fire_at, last_fired_at,
                       last_task_id, fired, skipped, updated_at)
VALUES (%s, %s, %s, %s, %s::timestamptz, %s::timestamptz, %s, %s, %s, %s::timestamptz)
ON CONFLICT (node, name) DO UPDATE SET
    task = excluded.task, trigger_text = excluded.trigger_text,
    next_fire_at = excluded.next_fire_at, last_fired_at = excluded.last_fired_at,
    last_task_id = excluded.last_task_id, fired = excluded.fired,
    skipped = excluded.skipped, updated_at = excluded.updated_at

-- name: forget_schedule
DELETE FROM {schema}.schedules WHERE node = %s AND name = %s

-- name: schedules
SELECT node, name, task, trigger_text, next_fire_at, last_fired_at, last_task_id, fired,
       skipped, updated_at
FROM {schema}.schedules ORDER BY node, name

-- name: upsert_pipeline
INSERT INTO {schema}.pipelines (pipeline_run_id, name, node, created_at, shape)
VALUES (%s, %s, %s, %s::timestamptz, %s)
ON CONFLICT (pipeline_run_id) DO UPDATE SET
    name = excluded.name, node = excluded.node, created_at = excluded.created_at,
    shape = excluded.shape

-- name: pipeline
SELECT pipeline_run_id, name, node, created_at, shape FROM {schema}.pipelines WHERE pipeline_run_id = %s

-- name: pipelines
SELECT pipeline_run_id, name, node, created_at, shape FROM {schema}.pipelines
ORDER BY created_at DESC LIMIT %s

-- name: finished_commands
SELECT command_id, task_id, action, issued_by, created_at, reason, lease_until,
    finished_at, outcome
FROM {schema}.commands WHERE finished_at > %s::timestamptz
ORDER BY finished_at LIMIT %s

-- name: notify
SELECT pg_notify(%s, '')

-- A command's wake-up, addressed to the node that holds its task; '' (everyone) for a
-- task nobody holds, gone or finished, whose command any node completes. A holder's
-- name too long for a payload (8,000 bytes; names are bounded far below, but a row
-- may predate the bound) wakes everyone too: the wake-up never refuses a command.
-- name: notify_command
SELECT pg_notify(%s, COALESCE((SELECT lease_owner FROM {schema}.tasks WHERE task_id = %s
    AND status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
    AND octet_length(lease_owner) <= 4000), ''))

-- Held by create_schema until its transaction ends: the DDL of one schema runs one
-- caller at a time (keys from postgres._schema_lock_key).
-- name: ddl_lock
SELECT pg_advisory_xact_lock(%s, %s)

-- Group commit (chongming_task.stores._pg_group): the writes of many callers, one
-- statement, WITH new AS (...), life AS (...), trail AS (...) then group_outcome. The
-- parts a batch does not need are the group_no_* stubs: a part costs its statement's
-- locks and executor start even with no rows. Parameters are JSON arrays of rows, one
-- text each (the driver encodes one string, not an array per column); JSON values are
-- the codec's texts. A batch holds each task id once.

-- New tasks, rows in TASK_COLUMNS order.
-- name: group_new
new AS (
    INSERT INTO {schema}.tasks (
        task_id, name, status, status_version, attempt, tags, bucket, bucket_key,
        pipeline_run_id, owner, created_at, started_at, ended_at, last_heartbeat_at,
        progress, failure, outcome, lease_owner, lease_until, run_at, priority, dedupe_key,
        dedupe_window, concurrency_key, trace_context
    )
    SELECT e->>0, e->>1, e->>2, (e->>3)::int, (e->>4)::int, (e->>5)::jsonb, (e->>6)::int,
        e->>7, e->>8, e->>9, (e->>10)::timestamptz, (e->>11)::timestamptz,
        (e->>12)::timestamptz, (e->>13)::timestamptz, (e->>14)::jsonb, (e->>15)::jsonb,
        (e->>16)::jsonb, e->>17, (e->>18)::timestamptz, (e->>19)::timestamptz,
        (e->>20)::int, e->>21, (e->>22)::float8, e->>23, e->>24
    FROM json_array_elements(%s::json) AS e
    WHERE e->>21 IS NULL OR NOT EXISTS (  -- a success keeps its key (as insert_task)
        SELECT FROM {schema}.tasks t WHERE t.dedupe_key = e->>21 AND t.status = 'succeeded'
          AND t.dedupe_window IS NOT NULL
          AND t.ended_at + t.dedupe_window * interval '1 second' > (e->>10)::timestamptz
    )
    ON CONFLICT (task_id) DO NOTHING
    RETURNING task_id
)

-- name: group_no_new
new AS (SELECT NULL::text AS task_id WHERE false)

-- Compare-and-sets of the columns a task's life changes: rows of task id, expected
-- version, then the life columns; then their task ids as an array. The rows are found
-- through that array: the planner sees how many there are, and goes by the primary
-- key whatever the table's statistics say (through the JSON alone, it guessed 100 rows
-- and, on a table not analyzed yet, scanned it all).
-- name: group_life
changes AS (
    SELECT e->>0 AS task_id, (e->>1)::int AS expect, e->>2 AS status,
        (e->>3)::int AS status_version, (e->>4)::int AS attempt,
        (e->>5)::timestamptz AS started_at, (e->>6)::timestamptz AS ended_at,
        (e->>7)::timestamptz AS last_heartbeat_at, (e->>8)::jsonb AS progress,
        (e->>9)::jsonb AS failure, (e->>10)::jsonb AS outcome
    FROM json_array_elements(%s::json) AS e
), life AS (
    UPDATE {schema}.tasks t SET
        status = v.status, status_version = v.status_version, attempt = v.attempt,
        started_at = v.started_at, ended_at = v.ended_at,
        last_heartbeat_at = v.last_heartbeat_at, progress = v.progress,
        failure = v.failure, outcome = v.outcome
    FROM changes v
    WHERE t.task_id = ANY(%s::text[]) AND t.task_id = v.task_id
      AND t.status_version = v.expect
    RETURNING t.task_id
)

-- name: group_no_life
life AS (SELECT NULL::text AS task_id WHERE false)

-- Trail rows in TRANSITION_COLUMNS order, then a gate: 0 always, 1 if its task was
-- inserted here, 2 if its task's compare-and-set won here.
-- name: group_trail
trail AS (
    INSERT INTO {schema}.transitions (task_id, version, from_status, to_status, at, reason, actor)
    SELECT r.task_id, r.version, r.from_status, r.to_status, r.at, r.reason, r.actor
    FROM (
        SELECT e->>0 AS task_id, (e->>1)::int AS version, e->>2 AS from_status,
            e->>3 AS to_status, (e->>4)::timestamptz AS at, e->>5 AS reason,
            e->>6 AS actor, (e->>7)::int AS gate
        FROM json_array_elements(%s::json) AS e
    ) AS r
    WHERE r.gate = 0
       OR (r.gate = 1 AND r.task_id IN (SELECT task_id FROM new))
       OR (r.gate = 2 AND r.task_id IN (SELECT task_id FROM life))
    ON CONFLICT (task_id, version) DO NOTHING
)

-- The ids inserted ('n'), the ids whose compare-and-set won ('l'), and the version
-- each losing compare-and-set found ('v'; none for a task that does not exist); the
-- parameter is the compare-and-sets' task ids again.
-- name: group_outcome
SELECT 'n', task_id, NULL::int FROM new
UNION ALL SELECT 'l', task_id, NULL FROM life
UNION ALL
SELECT 'v', task_id, status_version FROM {schema}.tasks
WHERE task_id = ANY(%s::text[]) AND task_id NOT IN (SELECT task_id FROM life)

-- name: group_outcome_new
SELECT 'n', task_id, NULL::int FROM new

-- A few compare-and-sets, each its own pair of parts (life{n}, life_trail{n}; n from 1), for
-- the common batches of up to eight when few writers run at once: each row is found by
-- its primary key, so the prepared statement keeps one generic plan whatever the table
-- holds (the JSON form is planned for each execution: 0.3-0.6 ms of server time, three
-- times what one of these costs). Parameters of a pair: the life columns, the task id
-- and expected version, its trail rows (JSON, as group_trail without the gate).
-- name: group_life_pair
life{n} AS (
    UPDATE {schema}.tasks SET
        status = %s, status_version = %s, attempt = %s, started_at = %s::timestamptz,
        ended_at = %s::timestamptz, last_heartbeat_at = %s::timestamptz,
        progress = %s::jsonb, failure = %s::jsonb, outcome = %s::jsonb
    WHERE task_id = %s AND status_version = %s
    RETURNING task_id
)

-- A new task in a batch of a few, as a pair of parts (new{n}, new_trail{n}) beside the
-- group_life_pair ones, for the same reason: one generic plan (the JSON form of a lone
-- submit measured 470-510 us a round trip against 380-450 us for this). Parameters: the
-- task's columns (insert_task's order), then its trail rows (JSON, as group_trail without
-- the gate). {insert_task} is insert_task itself.
-- name: group_new_pair
new{n} AS (
    {insert_task}
    RETURNING task_id
)

-- The trail part of a pair: its rows, written if its task's part wrote ({part}{n}).
-- name: group_pair_trail
{part}_trail{n} AS (
    INSERT INTO {schema}.transitions (task_id, version, from_status, to_status, at, reason, actor)
    SELECT e->>0, (e->>1)::int, e->>2, e->>3, (e->>4)::timestamptz, e->>5, e->>6
    FROM json_array_elements(%s::json) AS e
    WHERE EXISTS (SELECT FROM {part}{n})
    ON CONFLICT (task_id, version) DO NOTHING
)

-- name: group_new_pair_outcome
SELECT 'n', task_id, NULL::int FROM new{n}

-- A pair's outcome, as group_outcome's; the parameter is its task id again.
-- name: group_life_pair_outcome
SELECT 'l', task_id, NULL::int FROM life{n}
UNION ALL
SELECT 'v', task_id, status_version FROM {schema}.tasks
WHERE task_id = %s AND NOT EXISTS (SELECT FROM life{n})

-- The tasks that may hold a dedupe key (create_deduped): the unfinished one, and successes
-- that keep it for a window; one probe of idx_tasks_dedupe.
-- name: dedupe_holders
SELECT task_id, status, ended_at, dedupe_window FROM {schema}.tasks
WHERE dedupe_key = %s
  AND (status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost')
       OR (status = 'succeeded' AND dedupe_window IS NOT NULL))

-- A batch of finished tasks pruned by age (prune_ended), the ids an array (each %s the
-- same): their trail, late reports and finished commands with them.
-- name: prune_ids
WITH gone_history AS (DELETE FROM {schema}.transitions WHERE task_id = ANY(%s)),
gone_reports AS (DELETE FROM {schema}.late_reports WHERE task_id = ANY(%s)),
gone_holds AS (DELETE FROM {schema}.holds WHERE task_id = ANY(%s)),
gone_commands AS (
    DELETE FROM {schema}.commands WHERE finished_at IS NOT NULL AND task_id = ANY(%s)
)
DELETE FROM {schema}.tasks WHERE task_id = ANY(%s)

-- A pipeline run goes with its last task: %s the runs of the tasks just pruned.
-- name: prune_pipelines
DELETE FROM {schema}.pipelines p WHERE p.pipeline_run_id = ANY(%s)
  AND NOT EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.pipeline_run_id = p.pipeline_run_id)

-- Every pipeline run with no task left (``prune`` by count, which reads them all anyway).
-- name: prune_orphan_pipelines
DELETE FROM {schema}.pipelines p WHERE NOT EXISTS (
    SELECT 1 FROM {schema}.tasks t WHERE t.pipeline_run_id = p.pipeline_run_id
)

-- Finished commands by age, oldest first, through the index of finished commands: the
-- command log's own retention (a task that lives long gathers many).
-- name: prune_finished_commands
DELETE FROM {schema}.commands WHERE command_id IN (
    SELECT command_id FROM {schema}.commands
    WHERE finished_at IS NOT NULL AND finished_at < %s::timestamptz
    ORDER BY finished_at LIMIT %s
)

-- name: count_finished_commands
SELECT COUNT(*) FROM {schema}.commands
WHERE finished_at IS NOT NULL AND finished_at < %s::timestamptz
