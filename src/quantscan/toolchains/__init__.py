"""Real vendor toolchains: run out of process, their logs read, their layers lined up with quantscan's.

One subpackage per toolchain (`rknn`, `tpumlir`, `horizon`) holds what is particular to it: the driver
script run by the vendor's own Python (`rknn/driver.py`, never imported here: standard library + numpy +
the SDK, talking through JSON/.npy files), the in-process side of a run (`rknn/run.py`), what the toolkit
wrote (`rknn/files.py`) and its log reader (`log.py`). Shared across toolchains: `interpreter` finds the
vendor's Python, `parsed` is the shape every log reader returns, `mapping` names vendor layers back to
ONNX, `findings` turns a log into `check`'s findings, `logs` ties the readers together (`quantscan log`),
`align` joins a vendor run with quantscan's scan and check, `result` writes vendor.csv / vendor.json.
"""
