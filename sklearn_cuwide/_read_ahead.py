"""The next chunks of an out-of-memory loop read while the current one trains.

Rule: the items are read by one background thread, in order, at most
``ahead`` of them waiting; the caller's thread does the training.  Why: a
``partial_fit`` loop over files waits for each read and then for each fit,
one after the other, where the two could overlap (file reads and parsers
release the GIL, the GPU trains while the host waits).
"""

import numbers
import queue
import threading

__all__ = ["read_ahead"]

_END = object()


def read_ahead(chunks, ahead=1):
    """Iterate over ``chunks`` with the next ``ahead`` items read by a
    background thread while the loop works on the current one.

    ``chunks`` is any iterable, typically a generator that reads the chunks
    of a data set from disk (``sklearn.datasets.load_svmlight_file`` with
    ``offset`` and ``length``, ``scipy.sparse.load_npz``, Parquet row
    groups): with ``partial_fit`` in the loop, the reads of the next chunks
    overlap the training on this one.

    Parameters
    ----------
    chunks : iterable
        The items, read (iterated) by the background thread, in order.
    ahead : int, default=1
        The most items read and waiting: memory for ``ahead + 1`` chunks
        (the one trained and those waiting) is held at once.

    Yields
    ------
    item
        The items of ``chunks``, in order. An exception raised while reading
        an item is raised here, where that item would have come. Leaving the
        loop early (``break``) stops the reading after the item being read,
        once the iterator is dropped (a ``for`` loop over the call drops it
        as it leaves; an iterator kept in a variable stops when closed with
        its ``close()`` or deleted).

    Examples
    --------
    >>> from sklearn_cuwide import read_ahead
    >>> def chunks():
    ...     for start in range(0, 6, 2):
    ...         yield list(range(start, start + 2))    # a read from disk, say
    >>> [c for c in read_ahead(chunks())]
    [[0, 1], [2, 3], [4, 5]]
    """
    if isinstance(ahead, bool) or not isinstance(ahead, numbers.Integral) or ahead < 1:
        raise ValueError(f"ahead must be an int >= 1, got {ahead!r}")
    return _read_ahead(iter(chunks), int(ahead))


def _read_ahead(it, ahead):
    """:func:`read_ahead`'s generator (its arguments checked at the call).

    A semaphore of ``ahead`` permits bounds the items read or being read
    and not yet taken by the loop: the reader takes one before each read,
    the loop gives it back when it takes the item."""
    waiting = queue.Queue()
    permits = threading.Semaphore(ahead)
    stop = threading.Event()

    def read():
        try:
            while True:
                while not permits.acquire(timeout=0.05):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                try:
                    item = next(it)
                except StopIteration:
                    waiting.put((True, _END))
                    return
                waiting.put((True, item))
        except BaseException as exc:  # given to the loop, where the item would come
            waiting.put((False, exc))
        finally:
            close = getattr(it, "close", None)  # a generator's files, say
            if close is not None:
                close()

    reader = threading.Thread(target=read, name="sklearn_cuwide-read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            ok, item = waiting.get()
            if not ok:
                raise item
            if item is _END:
                return
            permits.release()
            yield item
    finally:
        stop.set()
