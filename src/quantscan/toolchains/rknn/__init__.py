"""Rockchip RKNN-Toolkit2: the driver script, the run, its files and its log."""
