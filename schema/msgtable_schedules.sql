-- The schedules table (docs/how-to/schedules.md): recurring messages, each tick of a cron
-- expression enqueued once into a message table by the msgtable server that holds the
-- schedules' placement unit. msgtable creates it with the first schedule when its user may
-- CREATE; otherwise create it once with this file and grant the server's user SELECT, INSERT,
-- UPDATE, DELETE on it. A row per schedule; next_tick 0 (a row made by hand) starts at its
-- first tick after the server sees it.
CREATE TABLE IF NOT EXISTS msgtable_schedules (
  name VARCHAR(64) NOT NULL,
  table_name VARCHAR(64) NOT NULL,
  cron VARCHAR(255) NOT NULL,
  timezone VARCHAR(64) NOT NULL DEFAULT 'UTC',
  message_values TEXT NOT NULL,
  missed VARCHAR(8) NOT NULL DEFAULT 'skip',
  next_tick BIGINT NOT NULL DEFAULT 0,
  last_tick BIGINT NULL,
  last_enqueued BIGINT NULL,
  ticks BIGINT NOT NULL DEFAULT 0,
  time_created BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (name)
) ENGINE=InnoDB COMMENT 'msgtable: recurring messages (msgtable schedule)';
