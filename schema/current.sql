-- The current message table layout (Vitess 6.0+ compatible).
-- Copy it, rename the table, add your own columns after time_created (they are streamed to
-- subscribers, id first), and tune the COMMENT (see README: Comment fields).
-- time_next: unix nanoseconds; 0, NULL or anything in the past means "send now".
-- Lower priority is sent first.
-- time_created (optional, not streamed): when the message was enqueued, unix nanoseconds;
-- msgtable report's delivery latency (created -> acked) needs it.
create table if not exists my_message(
  id bigint not null,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  message varchar(128),
  primary key(id),
  index poller_idx(time_acked, priority, time_next)
) engine=InnoDB comment 'vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,vt_cache_size=10000,vt_poller_interval=30';
