"""read_ahead: the items in order, read ahead on another thread, errors
where the item would have come, and an early exit that stops the reads."""

import threading
import time

import numpy as np
import pytest

from sklearn_cuwide import read_ahead


def test_the_items_come_in_order_and_are_read_on_another_thread():
    readers = []

    def chunks():
        for i in range(7):
            readers.append(threading.current_thread())
            yield i

    assert list(read_ahead(chunks(), ahead=2)) == list(range(7))
    assert readers and all(t is not threading.current_thread() for t in readers)
    assert list(read_ahead([])) == []


def _recorded(n, read):
    """The items ``0 .. n - 1``, each appended to ``read`` when it is read."""
    for i in range(n):
        read.append(i)
        yield i


def test_the_next_item_is_read_while_the_loop_works():
    """With ahead=1 the reader has the next item read (and no more) while the
    loop body runs: the reads and the loop overlap, bounded."""
    read = []
    for i in read_ahead(_recorded(4, read), ahead=1):
        deadline = time.monotonic() + 5
        while len(read) < min(i + 2, 4) and time.monotonic() < deadline:
            time.sleep(0.005)  # the loop's work
        assert len(read) == min(i + 2, 4)
        time.sleep(0.02)
        # the item in the loop and one read ahead: none beyond
        assert len(read) <= i + 2


def test_an_error_while_reading_comes_where_its_item_would():
    def chunks():
        yield 1
        yield 2
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for item in read_ahead(chunks()):
            got.append(item)
    assert got == [1, 2]


def test_leaving_early_stops_the_reads():
    read = []
    for i in read_ahead(_recorded(1000, read), ahead=1):
        if i == 2:
            break
    time.sleep(0.3)  # the reader notices the stop after the item it reads
    assert len(read) <= 5


@pytest.mark.parametrize("ahead", [0, -1, 1.5, True, "2", np.int64(0)])
def test_ahead_is_checked_at_the_call(ahead):
    with pytest.raises(ValueError, match="ahead must be an int >= 1"):
        read_ahead([1], ahead=ahead)


def test_ahead_takes_numpy_integers():
    assert list(read_ahead(range(5), ahead=np.int64(2))) == list(range(5))


def _closing(closed):
    """A source of 1000 items that sets ``closed`` when it is closed."""
    try:
        for i in range(1000):
            yield i
    finally:
        closed.set()


def test_leaving_early_closes_the_source():
    closed = threading.Event()
    for i in read_ahead(_closing(closed), ahead=2):
        if i == 1:
            break
    assert closed.wait(5)


def test_a_kept_iterator_stops_reading_when_closed():
    """An iterator kept in a variable goes on holding its items until it is
    closed: close() stops the reader and closes the source."""
    closed = threading.Event()
    it = read_ahead(_closing(closed), ahead=2)
    assert next(it) == 0
    time.sleep(0.2)
    assert not closed.is_set()  # kept: the reader waits with its items
    it.close()
    assert closed.wait(5)
    readers = [t for t in threading.enumerate() if t.name == "sklearn_cuwide-read-ahead"]
    for t in readers:
        t.join(5)
    assert not any(t.is_alive() for t in readers)
