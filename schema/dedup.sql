-- A message table with idempotent enqueue (docs/how-to/dedup.md): a message whose dedup_key
-- the table holds (enqueued within the last vt_dedup_window seconds, 300 by default) is
-- refused by the database itself, error 1062, whoever INSERTs it (INSERT IGNORE and
-- INSERT ... ON DUPLICATE KEY UPDATE id = id leave it out instead; msgtable.enqueue leaves it
-- out and returns 0). A NULL key never collides. The server's purger clears a key to NULL once
-- its window has passed, so the key may be used again, and purges an acked row only once its
-- key is cleared.
-- dedup_key is varbinary so that keys differing only in case, accents or a trailing blank
-- are different keys (a case-insensitive collation would refuse the second as a duplicate).
-- Required (the table does not load without them): dedup_key takes NULL, a unique index on
-- dedup_key alone, time_created (the window runs from it), and an index that begins with
-- time_created (the purger finds the keys to clear through it).
create table if not exists order_jobs(
  id bigint not null,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  dedup_key varbinary(128),
  message varchar(128),
  primary key(id),
  unique index dedup_idx(dedup_key),
  index dedup_created_idx(time_created, dedup_key),
  index poller_idx(time_acked, priority, time_next)
) engine=InnoDB comment 'vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,vt_cache_size=10000,vt_poller_interval=30,vt_dedup=dedup_key,vt_dedup_window=300';
