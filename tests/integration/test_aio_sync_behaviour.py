"""The sync client's behaviour tests, unchanged, run against the asyncio client through a
thin sync face (tests/aio_adapter.SyncAio): each test below is the sync one called with a
served engine whose ``client`` is the aio client: every test of test_messaging,
test_settlement, test_ordering and test_subscriptions that needs only a served engine, but
those of what only the sync client has (SYNC_ONLY: ack_async, its Leaser object, raw
responses); test_aio_client.py has async twins of those that apply."""

from __future__ import annotations

import inspect

import pytest

from ..aio_adapter import SyncAio
from . import test_messaging, test_ordering, test_settlement, test_subscriptions
from .helpers import serve


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn) as s:
        s.client.close()
        s.client = SyncAio(s.server.address)  # type: ignore[assignment]
        try:
            yield s
        finally:
            s.client.close()


SAME = [
    test_settlement.test_a_poison_message_is_sent_exactly_max_attempts_times_then_is_a_dead_letter,
    test_settlement.test_reject_moves_the_message_to_the_dead_letter_table_now_with_its_reason,
    test_settlement.test_a_released_message_comes_back_after_its_delay_to_any_subscriber,
    test_settlement.test_a_closing_subscriber_releases_what_it_received_and_never_handed_out,
    test_settlement.test_a_closing_subscriber_releases_its_rest_late_but_never_a_later_delivery_of_it,
    test_settlement.test_a_release_at_once_counts_the_attempt_and_comes_back_at_once,
    test_settlement.test_a_renewed_message_is_not_redelivered_while_it_is_renewed,
    test_settlement.test_settling_ids_not_in_flight_counts_only_those_changed,
    test_settlement.test_a_late_release_or_renew_of_an_earlier_delivery_leaves_the_later_one_alone,
    test_settlement.test_a_late_release_or_renew_in_a_subscription_leaves_its_later_delivery_alone,
    test_messaging.test_message_ack_counts_and_an_acked_message_never_comes_back,
    test_messaging.test_subscribers_share_messages_round_robin_and_none_gets_one_twice,
    test_messaging.test_an_unacked_message_comes_back_after_its_backoff,
    test_messaging.test_dropping_a_table_ends_its_streams_with_not_found,
    test_ordering.test_each_keys_messages_arrive_in_order_one_batch_at_a_time_over_many_subscribers,
    test_ordering.test_streams_with_filters_take_a_keys_messages_from_its_head_and_keep_its_order,
    test_ordering.test_a_released_message_parks_only_its_key_until_it_comes_back_first,
    test_ordering.test_a_killed_subscribers_key_comes_back_from_its_head_after_the_ack_wait,
    *(
        getattr(test_subscriptions, name)
        for name in dir(test_subscriptions)
        if name.startswith("test_")
    ),
    test_settlement.test_a_redrive_stopped_half_way_and_rerun_moves_each_message_once,
    test_settlement.test_a_redrive_skips_ids_the_target_has_again_and_leaves_them_dead,
]
# What only the sync client has: ack_async and its queue, the Leaser object of auto-renew
# (test_aio_client has the async twin), the raw responses of a stream.
SYNC_ONLY = {
    "test_a_failed_async_ack_reaches_its_future_and_flush",
    "test_acks_queued_with_ack_async_are_merged_sent_and_counted",
    "test_acks_queued_within_the_linger_go_in_one_call_and_flush_does_not_wait_it",
    "test_close_sends_the_queued_acks_first",
    "test_fields_come_first_then_batches_of_at_most_batch_size",
    "test_auto_renew_keeps_a_slow_handlers_message",
}
# ... and every other test of these modules that needs nothing but a served engine.
SAME += [
    getattr(m, n)
    for m in (test_messaging, test_settlement, test_ordering)
    for n in dir(m)
    if n.startswith("test_")
    and n not in SYNC_ONLY
    and list(inspect.signature(getattr(m, n)).parameters) == ["served"]
    and getattr(m, n) not in SAME
]


@pytest.mark.parametrize("sync_test", SAME, ids=[t.__name__ for t in SAME])
def test_the_sync_clients_behaviour_test_passes_with_the_aio_client(served, sync_test):
    sync_test(served)
