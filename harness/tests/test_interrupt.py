"""The run's signal handler: an interrupt stays an interrupt, even where C code swallows it."""

import os
import signal

import pytest
from hvbench_harness.run import Interrupt


def test_a_signal_raises_keyboardinterrupt_and_is_remembered():
    interrupt = Interrupt()
    assert interrupt.taken is None
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        interrupt(signal.SIGTERM, None)
    assert interrupt.taken == "SIGTERM"


def test_an_interrupt_replaced_by_another_error_is_still_known():
    """What the Kafka client's subscribe did: the KeyboardInterrupt raised inside it came out
    as a TypeError. The handler's memory is what tells the run it was interrupted."""
    interrupt = Interrupt()
    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        with pytest.raises(TypeError):
            try:
                os.kill(os.getpid(), signal.SIGINT)  # handled before os.kill returns
            except KeyboardInterrupt:
                raise TypeError("expected list of unicode strings") from None
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupt.taken == "SIGINT"
