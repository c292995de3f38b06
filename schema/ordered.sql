-- An ordered message table (README: Ordering per key): the messages of one order_id are sent
-- in id order, one batch at a time; different order_ids go in parallel.
-- vt_order_key names the key column; the order index, beginning (key, time_acked, id), is
-- required (the table does not load without it): the poll finds each key's first unsettled
-- messages through it, whatever the key's backlog. With vt_order_by=COLUMN the index is
-- (key, time_acked, COLUMN) instead. Rows with a NULL key are unordered.
create table if not exists order_events(
  id bigint not null auto_increment,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  order_id varchar(64),
  event varchar(128),
  primary key(id),
  index poller_idx(time_acked, priority, time_next),
  index order_idx(order_id, time_acked, id)
) engine=InnoDB comment 'vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,vt_cache_size=10000,vt_poller_interval=30,vt_order_key=order_id';
