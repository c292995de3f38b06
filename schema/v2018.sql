-- The 2018 layout, exactly as printed in the Vitess messaging document of that time.
-- msgtable loads it as it is: there is no priority column (all rows share one priority),
-- and time_scheduled (unix nanoseconds) is the first delivery time of a row whose time_next
-- is still NULL. time_scheduled is part of the primary key, so inserts must set it
-- (0 or any past time means "send now"): the Vitess of 2018 filled it in for the
-- application, a plain MySQL client has to.
create table if not exists old_message(
time_scheduled bigint,
id bigint,
time_next bigint,
epoch bigint,
time_created bigint,
time_acked bigint,
message varchar(128),
primary key(time_scheduled, id),
unique index id_idx(id),
index next_idx(time_next, epoch)
) comment 'vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,vt_cache_size=10000,vt_poller_interval=30';
