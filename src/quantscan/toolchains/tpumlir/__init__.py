"""Sophgo tpu-mlir: its model_transform / calibration / model_deploy logs."""
