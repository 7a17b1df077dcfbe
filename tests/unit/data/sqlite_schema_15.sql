-- The SQLite schema as release 15 made it (chongming-task at dcacd35: sqlite_master of a
-- new file, in order), to build a true schema-15 file for the migration tests.


CREATE TABLE tasks (
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
    concurrency_key   TEXT,
    trace_context     TEXT
);
CREATE INDEX idx_tasks_status ON tasks (status);
CREATE INDEX idx_tasks_bucket ON tasks (bucket) WHERE bucket IS NOT NULL;
CREATE INDEX idx_tasks_created_at ON tasks (created_at);
CREATE INDEX idx_tasks_owner ON tasks (owner, created_at);
CREATE INDEX idx_tasks_pipeline ON tasks (pipeline_run_id)
    WHERE pipeline_run_id IS NOT NULL;
CREATE INDEX idx_tasks_dedupe ON tasks (dedupe_key)
    WHERE dedupe_key IS NOT NULL;
CREATE TABLE transitions (
    key         INTEGER PRIMARY KEY,
    task_id     TEXT NOT NULL,
    version     INTEGER NOT NULL CHECK (version BETWEEN 0 AND 16777215),
    from_status TEXT,
    to_status   TEXT NOT NULL,
    at          TEXT NOT NULL,
    reason      TEXT,
    actor       TEXT
);
CREATE TABLE loose_transitions (
    task_id     TEXT NOT NULL,
    version     INTEGER NOT NULL CHECK (version BETWEEN 0 AND 16777215),
    from_status TEXT,
    to_status   TEXT NOT NULL,
    at          TEXT NOT NULL,
    reason      TEXT,
    actor       TEXT,
    PRIMARY KEY (task_id, version)
) WITHOUT ROWID;
CREATE TABLE commands (
    command_id  TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL,
    action      TEXT NOT NULL,
    issued_by   TEXT,
    created_at  TEXT NOT NULL,
    reason      TEXT,
    lease_until TEXT,
    finished_at TEXT,
    outcome     TEXT
);
CREATE INDEX idx_commands_open ON commands (created_at)
    WHERE finished_at IS NULL;
CREATE INDEX idx_commands_pending ON commands (task_id)
    WHERE finished_at IS NULL;
CREATE INDEX idx_commands_finished ON commands (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE TABLE nodes (
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
);
CREATE TABLE late_reports (
    task_id       TEXT PRIMARY KEY,
    reported_by   TEXT NOT NULL,
    reported_at   TEXT NOT NULL,
    status        TEXT NOT NULL,
    ended_at      TEXT,
    outcome       TEXT,
    failure       TEXT,
    stored_status TEXT NOT NULL
);
CREATE INDEX idx_late_reports_at ON late_reports (reported_at);
CREATE TABLE holds (
    task_id TEXT PRIMARY KEY,
    since   TEXT NOT NULL,
    held_by TEXT NOT NULL
);
CREATE TABLE node_buckets (
    bucket     INTEGER NOT NULL,
    node       TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (bucket, node)
) WITHOUT ROWID;
CREATE TABLE schedules (
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
) WITHOUT ROWID;
CREATE TABLE pipelines (
    pipeline_run_id TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    node            TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    shape           TEXT NOT NULL
);
CREATE INDEX idx_pipelines_created_at ON pipelines (created_at);
CREATE VIEW task_writes AS SELECT
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
WHERE 0;
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
END;
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
END;
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
END;
