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


def test_decode_graph_is_the_batch1_decode_graph_after_a_prompt():
    import pytest

    from atlas_core.bench.graph_timing import decode_graph
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.bench.shapes import shape_config
    from atlas_core.engine.loading import create_backend
    be, registry = create_backend("mock")
    model = build_random_model(shape_config("tiny"), be, registry)
    engine, graph = decode_graph(model, be, 20)
    assert graph is engine.runner.graphs[1][0] and not engine.has_unfinished_requests()
    engine, graph = decode_graph(model, be, 20, batch=3)  # a step of all three was captured
    assert graph is engine.runner.graphs[3][0] and not engine.has_unfinished_requests()
    np_be, registry = create_backend("numpy")
    with pytest.raises(ValueError, match="no decode graph"):
        decode_graph(build_random_model(shape_config("tiny"), np_be, registry), np_be, 20)
