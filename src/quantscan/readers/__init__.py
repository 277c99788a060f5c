"""The guarded readers: every file quantscan reads that a user (or a vendor toolkit) wrote goes through here.

Why one package: each earlier reader grew its own checks (the calibration .npz reader sized arrays from
their headers, run.json caught deep nesting, the dump readers called a bare `np.load`), and the surface
that came later inherited none of them. Here each kind of file has one reader that refuses what it
cannot read as one `FileError` line (exit 2) naming the file, before allocating or recursing on a size
or depth the file itself claims:

- `readers.jsonfile`: JSON (decode errors, integer-digit limits, nesting depth capped before parsing);
- `readers.text`: UTF-8 text, and paths named inside files (no absolute, no `..`, no symlink escape);
- `readers.arrays`: `.npy`/`.npz` (headers checked first, no pickle or object arrays, size caps).

Submodules are imported directly (`from quantscan.readers.jsonfile import read_json`): the JSON and text
readers import the standard library only, so `quantscan --help` does not load numpy for them.
tests/test_layout.py holds the rest of the package to calling the readers, not np.load/json.loads.
"""
