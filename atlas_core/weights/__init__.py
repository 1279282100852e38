"""Checkpoint access: safetensors read by mmap (:class:`Checkpoint`) and model resolution."""

from atlas_core.weights.checkpoint import Checkpoint
from atlas_core.weights.quant_tensors import QuantizedTensorError
from atlas_core.weights.quantization import UnsupportedQuantizationError
from atlas_core.weights.resolve import ModelNotFoundError, resolve_model
from atlas_core.weights.safetensors_file import CheckpointError, SafetensorsFile, write_safetensors

__all__ = ["Checkpoint", "CheckpointError", "ModelNotFoundError", "QuantizedTensorError",
           "SafetensorsFile", "UnsupportedQuantizationError", "resolve_model",
           "write_safetensors"]
