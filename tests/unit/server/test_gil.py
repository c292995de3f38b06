import sys

from msgtable.server import gil


def test_the_server_hands_the_gil_over_within_a_millisecond():
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)  # CPython's default
        assert gil.tune() == gil.SWITCH_INTERVAL_S == sys.getswitchinterval()
        assert gil.SWITCH_INTERVAL_S <= 0.001
    finally:
        sys.setswitchinterval(before)
