"""Kernel targets come from the plugin registry (``register_kernel_targets``): the backend picks
the one serving the GPU, else the generic kernels; a target that fails to build is reported and
skipped (no GPU needed)."""

import logging

from atlas_cuda.targets import Target, load_targets, pick_target


class _Registry:
    def __init__(self, factories):
        self.factories = factories

    def names(self, kind):
        assert kind == "kernel_targets"
        return sorted(self.factories)

    def get(self, kind, name):
        return self.factories[name]


def _broken():
    raise FileNotFoundError("HARDWARE.toml missing")


def test_pick_target_by_capability_and_report_broken(caplog):
    hopper = Target("hopper", "sm_90a", compute_capabilities=((9, 0),))
    registry = _Registry({"hopper": lambda: hopper, "zbroken": _broken, "odd": lambda: 42})
    targets, broken = load_targets(registry)
    assert targets == [hopper]
    assert broken == [("odd", "factory returned int, not a Target"),
                      ("zbroken", "FileNotFoundError: HARDWARE.toml missing")]
    with caplog.at_level(logging.WARNING, logger="atlas_cuda.targets"):
        assert pick_target((9, 0), registry) is hopper
    assert "kernel target zbroken skipped" in caplog.text
    generic = pick_target((8, 9), registry)
    assert (generic.name, generic.arch, generic.root) == ("cuda", "sm_89", None)


def test_installed_targets_come_from_the_plugins():
    targets, broken = load_targets()
    names = {t.name: t for t in targets}
    assert not broken
    assert names["hopper"].arch == "sm_90a" and (9, 0) in names["hopper"].compute_capabilities
    assert names["gb10"].arch == "sm_121" and (12, 1) in names["gb10"].compute_capabilities


def test_model_folder_takes_the_exact_type_then_the_family(tmp_path):
    (tmp_path / "qwen3" / "bf16").mkdir(parents=True)
    (tmp_path / "gemma4_text").mkdir()
    target = Target("hopper", "sm_90a", root=tmp_path)
    assert target.model_folder("qwen3_moe") == "qwen3"
    assert target.model_folder("qwen3") == "qwen3"
    assert target.model_folder("gemma4_text") == "gemma4_text"
    assert target.model_folder("llama") is None and target.model_folder(None) is None
    assert Target("cuda", "sm_90").model_folder("qwen3") is None
