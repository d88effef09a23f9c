"""CallWatchdog: a call past its deadline is cut, an ended one never is, and the cut is told to its own thread."""

from __future__ import annotations

import threading

from strata.stores.call_watchdog import CallWatchdog


class Cuts:
    """A ``cut`` that records the connections it is asked to cut and declines the ``idle`` ones."""

    def __init__(self, *, failing: str = "") -> None:
        self.asked: list[str] = []
        self.done = threading.Event()
        self._failing = failing

    def __call__(self, conn: str) -> bool:
        self.asked.append(conn)
        if conn == self._failing:
            raise OSError("bad descriptor")
        if conn == "last":
            self.done.set()
        return not conn.startswith("idle")


def test_a_call_past_its_deadline_is_cut_and_one_that_ended_is_not() -> None:
    cuts = Cuts()
    watchdog = CallWatchdog(0.05, cuts)
    watchdog.arm("ended")  # falls due first: had it stayed armed, it would be cut no later than "last"
    watchdog.arm("last")
    watchdog.disarm("ended")

    assert cuts.done.wait(5)
    assert cuts.asked == ["last"] and watchdog.was_cut()
    watchdog.arm("next")  # a thread's next call forgets the cut
    assert not watchdog.was_cut()
    watchdog.disarm("next")


def test_a_declined_cut_is_not_reported_and_a_cut_is_reported_to_the_thread_whose_call_it_was() -> None:
    cuts = Cuts()
    watchdog = CallWatchdog(0.05, cuts)
    seen: list[bool] = []

    def calls() -> None:
        watchdog.arm("idle")  # its call ended without a disarm: the cut declines it
        watchdog.arm("last")
        cuts.done.wait(5)
        seen.append(watchdog.was_cut())

    other = threading.Thread(target=calls)
    other.start()
    other.join(10)

    assert cuts.done.is_set() and sorted(cuts.asked) == ["idle", "last"]
    assert seen == [True] and not watchdog.was_cut()


def test_a_cut_that_raises_leaves_the_watchdog_running() -> None:
    cuts = Cuts(failing="broken")
    watchdog = CallWatchdog(0.05, cuts)
    watchdog.arm("broken")
    watchdog.arm("last")

    assert cuts.done.wait(5)
    assert sorted(cuts.asked) == ["broken", "last"] and watchdog.was_cut()
