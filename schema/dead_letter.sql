-- A message table with a dead-letter table (README: Settlement and dead letters).
-- refunds sends each message at most 5 times; one still unacked when its 5th ack wait
-- ends, or rejected by a subscriber, is moved to refunds_dead in one transaction.
-- last_error (optional in refunds): the reason of the last release / reject / renew,
-- streamed to subscribers with the message.
create table if not exists refunds(
  id bigint not null,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  message varchar(128),
  last_error varchar(1000),
  primary key(id),
  index poller_idx(time_acked, priority, time_next)
) engine=InnoDB comment 'vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,vt_cache_size=10000,vt_poller_interval=30,vt_max_attempts=5,vt_dead_letter=refunds_dead';

-- The dead-letter table: a message table too (stream it, ack it, purge it, redrive it), with
-- every message column of refunds, and:
--   time_dead   when the message died, unix nanoseconds
--   attempts    how many times it was sent (its epoch then)
--   last_error  why: the reject's reason, else the last release / renew reason, else
--               "no ack after N attempts (vt_max_attempts=N)"
-- Its rows are due at once; without subscribers they just wait (msgtable dead lists them).
create table if not exists refunds_dead(
  id bigint not null,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  message varchar(128),
  time_dead bigint not null,
  attempts bigint not null,
  last_error varchar(1000),
  primary key(id),
  index poller_idx(time_acked, priority, time_next),
  index dead_idx(time_dead)
) engine=InnoDB comment 'vitess_message,vt_ack_wait=30,vt_purge_after=604800,vt_batch_size=10,vt_cache_size=10000,vt_poller_interval=30';
