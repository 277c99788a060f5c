"""Real vendor toolchains, run out of process and lined up with quantscan (`quantscan vendor`).

Vendor SDKs never enter quantscan's process: `interpreter` finds the vendor's own Python, a driver
script under `drivers/` (standard library + numpy + the SDK) runs there and talks through JSON/.npy
files, `rknn_files` reads what the toolkit wrote, `align` joins it with quantscan's scan and check,
`result` writes vendor.csv / vendor.json / vendor_findings.csv.
"""
