-- chongming-task PostgreSQL schema. Run once per schema by a role with DDL rights
-- (PostgresTaskStore.create_schema() or `chongming-task --db DSN migrate`); the store
-- itself only reads and writes, so a role without DDL rights can run it.
-- {schema} is replaced by a validated identifier, {version} by SCHEMA_VERSION.

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {schema}.tasks (
    seq               BIGSERIAL,
    task_id           TEXT PRIMARY KEY,
    name              TEXT NOT NULL,
    status            TEXT NOT NULL,
    status_version    INTEGER NOT NULL,
    attempt           INTEGER NOT NULL,
    tags              JSONB NOT NULL,
    bucket            INTEGER,
    bucket_key        TEXT,
    pipeline_run_id   TEXT,
    owner             TEXT,
    created_at        TIMESTAMPTZ NOT NULL,
    started_at        TIMESTAMPTZ,
    ended_at          TIMESTAMPTZ,
    last_heartbeat_at TIMESTAMPTZ,
    progress          JSONB,
    failure           JSONB,
    outcome           JSONB,
    lease_owner       TEXT,
    lease_until       TIMESTAMPTZ
);
-- Version 3: how a task was submitted (node.options), fixed at create.
ALTER TABLE {schema}.tasks ADD COLUMN IF NOT EXISTS run_at TIMESTAMPTZ;
ALTER TABLE {schema}.tasks ADD COLUMN IF NOT EXISTS priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {schema}.tasks ADD COLUMN IF NOT EXISTS dedupe_key TEXT;
ALTER TABLE {schema}.tasks ADD COLUMN IF NOT EXISTS dedupe_window DOUBLE PRECISION;
ALTER TABLE {schema}.tasks ADD COLUMN IF NOT EXISTS concurrency_key TEXT;
-- Version 4: the W3C trace context of the submit (an instrumented node's).
ALTER TABLE {schema}.tasks ADD COLUMN IF NOT EXISTS trace_context TEXT;
-- Version 6: the first 4001 characters of the result's JSON text, written with it, so a
-- reader shows the start of a large result (and tells it was cut: roles.PREVIEW is
-- 4000) without reading it whole (TOAST keeps the result itself out of the row).
-- Adding it rewrites the table once.
ALTER TABLE {schema}.tasks ADD COLUMN IF NOT EXISTS outcome_preview TEXT
    GENERATED ALWAYS AS (left(outcome::text, 4001)) STORED;
-- The successes that keep their dedupe key for a window (a task enters it once, as it
-- ends): with the index below, what a create and a duplicate's lookup probe. A task's
-- every status change writes an entry into each index it is in, so none covers every
-- task with a key (ps --dedupe-key scans).
CREATE INDEX IF NOT EXISTS idx_tasks_dedupe_kept ON {schema}.tasks (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status = 'succeeded' AND dedupe_window IS NOT NULL;
-- At most one unfinished task holds a dedupe key: a create that would make a second fails
-- in the group commit it rides (a create racing with an uncommitted one waits for it).
CREATE UNIQUE INDEX IF NOT EXISTS idx_tasks_dedupe_open ON {schema}.tasks (dedupe_key)
    WHERE dedupe_key IS NOT NULL
      AND status NOT IN ('succeeded', 'failed', 'stopped', 'cancelled', 'lost');
CREATE INDEX IF NOT EXISTS idx_tasks_status ON {schema}.tasks (status);
CREATE INDEX IF NOT EXISTS idx_tasks_bucket ON {schema}.tasks (bucket);
CREATE INDEX IF NOT EXISTS idx_tasks_created_at ON {schema}.tasks (created_at, seq);
CREATE INDEX IF NOT EXISTS idx_tasks_tags ON {schema}.tasks USING GIN (tags jsonb_path_ops);
CREATE INDEX IF NOT EXISTS idx_tasks_owner ON {schema}.tasks (owner, created_at, seq);
CREATE INDEX IF NOT EXISTS idx_tasks_pipeline ON {schema}.tasks (pipeline_run_id)
    WHERE pipeline_run_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS {schema}.transitions (
    task_id     TEXT NOT NULL,
    version     INTEGER NOT NULL,
    from_status TEXT,
    to_status   TEXT NOT NULL,
    at          TIMESTAMPTZ NOT NULL,
    reason      TEXT,
    actor       TEXT,
    PRIMARY KEY (task_id, version)
);

CREATE TABLE IF NOT EXISTS {schema}.commands (
    seq         BIGSERIAL,
    command_id  TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL,
    action      TEXT NOT NULL,
    issued_by   TEXT,
    created_at  TIMESTAMPTZ NOT NULL,
    reason      TEXT,
    lease_until TIMESTAMPTZ,
    finished_at TIMESTAMPTZ,
    outcome     TEXT
);
-- Claims only ever look at open commands, while the table keeps growing.
CREATE INDEX IF NOT EXISTS idx_commands_open ON {schema}.commands (created_at, seq)
    WHERE finished_at IS NULL;

-- Node declarations (docs/design.md, "Fleet declarations"): for audit and alarms only.
CREATE TABLE IF NOT EXISTS {schema}.nodes (
    node        TEXT PRIMARY KEY,
    num_buckets INTEGER NOT NULL,
    all_buckets BOOLEAN NOT NULL,
    ttl_seconds DOUBLE PRECISION NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL,
    seen_at     TIMESTAMPTZ NOT NULL,
    stopped_at  TIMESTAMPTZ,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL
);
-- Version 2: what the node says of its own health (docs/design.md, "Health").
ALTER TABLE {schema}.nodes ADD COLUMN IF NOT EXISTS health TEXT;

-- Version 2: what a node reported of a task after the store had ended it without it
-- (docs/design.md, "Late truth"): a record beside the final status, never a change of it.
CREATE TABLE IF NOT EXISTS {schema}.late_reports (
    task_id       TEXT PRIMARY KEY,
    reported_by   TEXT NOT NULL,
    reported_at   TIMESTAMPTZ NOT NULL,
    status        TEXT NOT NULL,
    ended_at      TIMESTAMPTZ,
    outcome       JSONB,
    failure       JSONB,
    stored_status TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_late_reports_at ON {schema}.late_reports (reported_at);
-- Tasks a pause holds before they started (CommandChannel): their status stays queued.
CREATE TABLE IF NOT EXISTS {schema}.holds (
    task_id TEXT PRIMARY KEY,
    since   TIMESTAMPTZ NOT NULL,
    held_by TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS {schema}.node_buckets (
    bucket     INTEGER NOT NULL,
    node       TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (bucket, node)
);

-- Schedule declarations: for people (the CLI's `schedules`); a firing never reads them.
CREATE TABLE IF NOT EXISTS {schema}.schedules (
    node          TEXT NOT NULL,
    name          TEXT NOT NULL,
    task          TEXT NOT NULL,
    trigger_text  TEXT NOT NULL,
    next_fire_at  TIMESTAMPTZ,
    last_fired_at TIMESTAMPTZ,
    last_task_id  TEXT,
    fired         INTEGER NOT NULL,
    skipped       INTEGER NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node, name)
);

-- Pipeline run shapes, for people (the dashboard draws the graph).
CREATE TABLE IF NOT EXISTS {schema}.pipelines (
    pipeline_run_id TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    node            TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    shape           TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_pipelines_created_at ON {schema}.pipelines (created_at);

-- A task's open commands (a control judged after the ones before it).
CREATE INDEX IF NOT EXISTS idx_commands_pending ON {schema}.commands (task_id, seq)
    WHERE finished_at IS NULL;

-- Finished commands by finish time (the dashboard's command latency).
CREATE INDEX IF NOT EXISTS idx_commands_finished ON {schema}.commands (finished_at)
    WHERE finished_at IS NOT NULL;

-- The version of these tables (one row). A store refuses a schema whose version is
-- newer than its release's (it could misread the tables, or write rows they no longer
-- mean); a schema made before this table existed is version 1. Never lowered here.
CREATE TABLE IF NOT EXISTS {schema}.schema_version (
    one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    version INTEGER NOT NULL
);
INSERT INTO {schema}.schema_version (version) VALUES ({version})
    ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version
    WHERE {schema}.schema_version.version < EXCLUDED.version;
