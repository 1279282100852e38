"""atlas_core.bench.graph_timing: median of event-timed graph replays."""

from atlas_core.bench.graph_timing import graph_ms, replay_ms


class FakeBackend:
    """Events are replay counters; replay n takes n milliseconds."""

    def __init__(self):
        self.replays, self.syncs, self.captured = 0, 0, None

    def capture(self, fn):
        self.captured = fn
        return self

    def replay(self):
        self.replays += 1

    def synchronize(self):
        self.syncs += 1

    def event(self):
        return self.replays

    def elapsed_ms(self, start, end):
        return float(end) if end > start else 0.0


def test_replay_ms_warms_up_then_takes_the_median():
    be = FakeBackend()
    assert replay_ms(be, be, reps=5) == 4.0  # replays 2..6 timed, the first is the warm-up
    assert be.replays == 6 and be.syncs == 1


def test_graph_ms_captures_the_callable():
    be = FakeBackend()
    fn = lambda: None  # noqa: E731
    assert graph_ms(be, fn, reps=3) == 3.0 and be.captured is fn
