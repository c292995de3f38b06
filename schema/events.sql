-- A capture table (README: Table events): every committed change of the tables orders_* and
-- customers (inserts, updates, deletes; CREATE / ALTER / DROP / RENAME / TRUNCATE TABLE) is
-- written here by the server that holds the lease, as one message, and delivered like any.
-- vt_capture names the source tables ('|'-separated, * and ? wildcards), vt_capture_kinds the
-- kinds (default: all). The event columns are fixed; vt_order_key=row_key delivers the events
-- of one source row in commit order.
create table if not exists table_events(
  id bigint not null auto_increment,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  source_table varchar(64) not null,
  kind varchar(16) not null,
  pk json,
  row_key varchar(255) not null,
  before_values json,
  after_values json,
  time_commit bigint not null,
  position varchar(255) not null,
  primary key(id),
  index poller_idx(time_acked, priority, time_next),
  index order_idx(row_key, time_acked, id)
) engine=InnoDB comment 'vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,vt_cache_size=10000,vt_poller_interval=30,vt_capture=orders_*|customers,vt_order_key=row_key';
