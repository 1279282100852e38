"""The Ray worker path (``--distributed-executor-backend ray``) against a stand-in ``ray``
module (Ray is not a dependency): one task per rank on one GPU, a cluster joined with
``address="auto"`` when none is up, and the process-like surface the executor watches (exit
code from the task's result, 1 for a task that died, cancel on terminate / kill)."""

import sys
import types

import pytest

from atlas_core.parallel import ray_executor


class _Ref:
    def __init__(self, result=None, error=None, done=True):
        self.result, self.error, self.done = result, error, done


def _fake_ray(initialized=False):
    ray = types.ModuleType("ray")
    ray.calls = []
    ray.is_initialized = lambda: initialized
    ray.init = lambda **kw: ray.calls.append(("init", kw))

    def remote(**options):
        def wrap(fn):
            ray.calls.append(("remote", options, fn))
            return types.SimpleNamespace(remote=lambda spec: _Ref(result=spec.rank))
        return wrap
    ray.remote = remote
    ray.wait = lambda refs, timeout=None: ([r for r in refs if r.done],
                                           [r for r in refs if not r.done])

    def get(ref):
        if ref.error is not None:
            raise ref.error
        return ref.result
    ray.get = get
    ray.cancel = lambda ref, force=False: ray.calls.append(("cancel", ref, force))
    ray.util = types.SimpleNamespace(get_node_ip_address=lambda: "10.0.0.7")
    return ray


def test_spawns_one_gpu_task_a_rank_and_joins_the_cluster(monkeypatch):
    ray = _fake_ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    specs = [types.SimpleNamespace(rank=r) for r in range(2)]
    workers = ray_executor.spawn_ray_workers(specs)
    assert ray.calls[0] == ("init", {"address": "auto"})
    assert ray.calls[1][1] == {"num_gpus": 1} and ray.calls[1][2] is ray_executor._run
    assert [w.name for w in workers] == ["atlas-worker-0", "atlas-worker-1"]
    assert [w.exitcode for w in workers] == [0, 1] and not workers[0].is_alive()
    assert ray_executor.node_address() == "10.0.0.7"


def test_an_initialized_cluster_is_not_joined_again(monkeypatch):
    ray = _fake_ray(initialized=True)
    monkeypatch.setitem(sys.modules, "ray", ray)
    ray_executor.spawn_ray_workers([types.SimpleNamespace(rank=0)])
    assert not [c for c in ray.calls if c[0] == "init"]


@pytest.mark.parametrize("ref,code,alive", [(_Ref(done=False), None, True),
                                            (_Ref(result=0), 0, False),
                                            (_Ref(result=3), 3, False),
                                            (_Ref(error=RuntimeError("task died")), 1, False)])
def test_worker_reports_its_task_like_a_process(ref, code, alive):
    ray = _fake_ray()
    worker = ray_executor.RayWorker(ray, ref, "atlas-worker-0")
    assert worker.exitcode == code and worker.is_alive() is alive
    worker.join(timeout=0.1)
    worker.terminate()
    worker.kill()
    assert ray.calls == [("cancel", ref, True), ("cancel", ref, True)]
