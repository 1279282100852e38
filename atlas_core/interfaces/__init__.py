"""The contracts plugins implement: one short ABC per file."""

from atlas_core.interfaces.comm_backend import CommBackend
from atlas_core.interfaces.gpu_backend import (DeviceEvent, DeviceInfo, EagerGraph, GpuBackend,
                                               Graph, HostRead)
from atlas_core.interfaces.layer import (KVCacheSpec, LatentCacheSpec, RecurrentStateSpec,
                                         SlidingWindowCacheSpec, TransformerLayer)
from atlas_core.interfaces.metadata import StepMetadata
from atlas_core.interfaces.storage_backend import StorageBackend
from atlas_core.interfaces.weight_loader import ModelWeightLoader

__all__ = [
    "CommBackend", "DeviceEvent", "DeviceInfo", "EagerGraph", "GpuBackend", "Graph", "HostRead",
    "KVCacheSpec", "LatentCacheSpec", "ModelWeightLoader", "RecurrentStateSpec",
    "SlidingWindowCacheSpec", "StepMetadata", "StorageBackend", "TransformerLayer",
]
