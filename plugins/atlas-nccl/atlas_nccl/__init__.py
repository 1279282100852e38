"""Atlas plugin: the ``nccl`` CommBackend over NVIDIA's nccl4py (entry point ``nccl``) and the
cuda implementations of the tensor / expert parallel ops."""
