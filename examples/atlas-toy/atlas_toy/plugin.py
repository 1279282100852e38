"""Entry point of the plugin: registers lazily, so importing it imports nothing heavy.

It provides a model family (the ``ToyForCausalLM`` weight loader) and an op of its own,
``toy_softcap``: the spec (NumPy reference and contract cases), a numpy implementation, a CUDA
implementation and the folder of its ``.cu`` source.
"""

from atlas_core.api import OpSpec, hookimpl

#: The op this plugin adds, declared once.
TOY_SOFTCAP = OpSpec("toy_softcap", "atlas_toy.softcap:toy_softcap",
                     cases="atlas_toy.softcap_cases:toy_softcap_cases")


@hookimpl
def register_weight_loaders(register):
    register("ToyForCausalLM", "atlas_toy.loader:ToyLoader")


@hookimpl
def register_ops(register):
    register(TOY_SOFTCAP.name, TOY_SOFTCAP)
    register(TOY_SOFTCAP.name, "atlas_toy.softcap:toy_softcap_numpy", backend="numpy")
    register(TOY_SOFTCAP.name, "atlas_toy.cuda.softcap_ops:ToyCudaOps.toy_softcap",
             backend="cuda")


@hookimpl
def register_kernel_sources(register):
    register("toy", "atlas_toy.cuda:kernel_dir")
